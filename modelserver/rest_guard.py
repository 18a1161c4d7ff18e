"""The model server's REST front door: an ASGI layer in front of KServe's FastAPI app that
holds every request body to its bound and checks an inference request against its
model's `Bounds` before FastAPI parses it or KServe decodes it.

Why in front of FastAPI: by the time KServe's `infer` handler (or our model) sees a request,
FastAPI has read the whole body and pydantic has built the request from it (coercing
`"4"` to 4 on the way); a 300 KB body then turned into a 1.7 GB JSON answer. Here:

- a body longer than the bound (its `Content-Length`, or its bytes as they arrive) is
  answered 413 without keeping any of it: the rest is read and dropped (up to
  `DRAIN_BYTES`, for `DRAIN_SECONDS`) so that the client, which may still be sending,
  reads the answer instead of a connection reset; a longer body gets the 413 and the
  connection closed;
- `POST /v2/models/{name}[/versions/{v}]/infer` for a served model is read (at most
  `Bounds.rest_body_bytes`), parsed once with the standard library (integers of any size
  stay exact, so one beyond INT64 is named, not a 500), and checked: one INT64
  `input_ids`, a shape of two positive integers within the sequence and token bounds, an
  answer within `--max-answer-bytes`, data that are integers within INT64 and as many as
  the shape says (or, with the binary extension, exactly the bytes it says). A refusal
  is 413 (over a bound) or 400 (malformed), `{"error": "..."}`, and one log line;
- the model repository's load and unload endpoints are refused (403): a policyc model
  server serves the instances it was started with, and an unload from any client would
  take an instance down.

What passes goes on to FastAPI with the very bytes that were read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import unquote

from .bounds import JSON_OVERHEAD, Bounds, BoundError, Malformed, check_answer, check_header, check_ids, check_shape, flatten

log = logging.getLogger("policyc.modelserver")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/infer/?$")
REPOSITORY = re.compile(r"^/v2/repository/|^/v1/models/[^/]+:(?:load|unload)$")
BINARY_HEADER = "inference-header-content-length"
DRAIN_BYTES = 16 << 20
DRAIN_SECONDS = 5.0


class _Gone(Exception):
    """The client went away before its body was read: nothing to answer."""


class _Refused(Exception):
    def __init__(self, status: int, message: str, *, unread: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.unread = unread  # the body was not read to its end


def check_rest_body(body: bytes, headers: Mapping[str, str], bounds: Bounds) -> None:
    """An infer request's body against `bounds`; BoundError naming the problem."""
    json_part = body
    binary = headers.get(BINARY_HEADER)
    if binary is not None:
        if not binary.strip().isdigit() or int(binary) > len(body):
            raise Malformed(f"header `{BINARY_HEADER}`: `{binary[:40]}` is not a length within the body of {len(body)} bytes")
        json_part = body[:int(binary)]
    try:
        doc = json.loads(json_part)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and over-long integers are ValueErrors
        raise Malformed(f"the body is not JSON: {str(e)[:120]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise Malformed("the body must be a JSON object with a list `inputs` (Open Inference Protocol v2)")
    inputs = doc["inputs"]
    if len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise Malformed(f"takes one input `input_ids`, got {len(inputs)}")
    tensor = inputs[0]
    name = tensor.get("name")
    check_header(name if isinstance(name, str) else repr(name), tensor.get("datatype"))
    batch, sequence = check_shape(cast(Sequence[object], tensor.get("shape")), bounds)  # it names a non-list too
    check_answer(batch, sequence, bounds, json=True)
    n = batch * sequence
    if "data" in tensor:
        check_ids(flatten(tensor["data"], n), n)
        return
    params = tensor.get("parameters")
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if binary is None or not isinstance(size, int) or isinstance(size, bool):
        raise Malformed("input `input_ids` has no `data` (nor a binary_data_size with the binary extension)")
    if size != n * 8 or int(binary) + size != len(body):
        raise Malformed(f"input `input_ids`: binary data of {size} bytes ({len(body) - int(binary)} sent); "
                        f"shape [{batch}, {sequence}] INT64 is {n * 8}")


class RestGuard:
    """ASGI middleware: body bounds, infer checks, no repository changes (module docstring)."""

    def __init__(self, app: ASGIApp, bounds: Mapping[str, Bounds]) -> None:
        self.app = app
        self.bounds = dict(bounds)
        # the bound of any other body (v1 predict, unknown models): the largest legal one
        self.max_body = max((b.rest_body_bytes for b in self.bounds.values()), default=JSON_OVERHEAD)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        headers: dict[str, str] = {}
        try:
            if REPOSITORY.search(path):
                raise _Refused(403, "this model server serves the instances it was started with: "
                                    "its model repository is not changed over REST")
            m = INFER.match(path)
            bounds = self.bounds.get(unquote(m.group(1))) if m else None
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
            limit = bounds.rest_body_bytes if bounds is not None else self.max_body
            body = await self._body(receive, headers, limit, bounds)
            if bounds is not None:
                try:
                    check_rest_body(body, headers, bounds)
                except BoundError as e:
                    raise _Refused(e.status, str(e)) from None
        except _Refused as e:
            # a client waiting for 100 Continue has sent nothing yet: it gets the refusal instead
            waiting = headers.get("expect", "").lower() == "100-continue"
            drained = await _drain(receive) if e.unread and not waiting else not e.unread
            await self._refuse(scope, send, e.status, str(e), close=not drained)
            return
        except _Gone:
            return
        await self.app(scope, _replay(body, receive), send)

    @staticmethod
    async def _body(receive: Receive, headers: Mapping[str, str], limit: int, bounds: Bounds | None) -> bytes:
        whose = f"model `{bounds.model}`" if bounds is not None else "this server"
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise _Refused(400, f"Content-Length `{declared[:40]}` is not a length")
            if int(declared) > limit:
                raise _Refused(413, f"a body of {int(declared)} bytes is over the {limit}-byte bound of {whose} "
                                    f"(its largest legal request)", unread=True)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _Refused(413, f"a body of more than {limit} bytes is over the bound of {whose} "
                                    "(its largest legal request)", unread=message.get("more_body", False))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, message: str, *, close: bool) -> None:
        client = scope.get("client") or ("?", 0)
        log.warning("refused %s %s from %s:%s: %d %s", scope.get("method"), scope.get("path", "")[:200], client[0], client[1],
                    status, message)
        payload = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + ([(b"connection", b"close")] if close else [])})
        await send({"type": "http.response.body", "body": payload})


async def _drain(receive: Receive) -> bool:
    """Read and drop the rest of a refused body; True when it ended within the limits."""
    async def read() -> bool:
        dropped = 0
        while dropped <= DRAIN_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return False
            dropped += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
        return False

    try:
        return await asyncio.wait_for(read(), DRAIN_SECONDS)
    except asyncio.TimeoutError:
        return False


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body already read, then the connection's own messages."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
