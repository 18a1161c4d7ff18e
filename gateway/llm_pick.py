"""The picker's LLM half: a pick made from an OpenAI-style request's body.

On `/v1/chat/completions` and `/v1/completions` Envoy sends the picker the request's headers
and then its whole body (the bootstrap's LLM routes, `llm_routes.py`). The headers are let
through at once; the body is read (`llm_body.parse_llm_body`: the model, the prompt's tokens
by the model's tokenizer, `max_tokens`, `stream`, `user`), and the pick is made on both: the
headers as the policy maps them, the body's facts as request variables (`request.model`,
`request.prompt_tokens`, `request.max_tokens`, `request.stream`), through the picker's own
decision path (`EndpointPicker._request_headers`). The answer goes back on the body message:
the same endpoints, budget, retry headers and metadata as a headers pick, plus
`x-policyc-upstream: http1` and a fresh route when the picked endpoint speaks HTTP/1.1 (its
instance's `endpoint_protocol` label), and the body with `stream_options.include_usage` when
the client streams without asking for usage (the audit's token counts come from it).

A bad body is answered 400 with the reason in `x-policyc-reason` and an OpenAI-style error
object; every other refusal on these paths (a rule, no instance, shedding) carries the same
error object, so the OpenAI clients raise their usual exceptions with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import msgspec
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from policyc.compiler.bundle import Scalar
from policyc.placer.request_facts import CURRENT as CURRENT_FACTS, RequestFacts, prefix_blocks, prompt_text

from .llm_body import BodyError, LlmRequest, parse_llm_body, path_kind, upstream_body
from .bootstrap import PER_TRY_TIMEOUT
from .llm_routes import HTTP1, PROTOCOL_LABEL, UPSTREAM_HEADER
from .messages import CAUSE_HEADER, REASON_HEADER, RULE_HEADER
from .refusal import ascii_line
from .tokens import TokenizerError, Tokenizers

if TYPE_CHECKING:
    from .pick import Pick
    from .picker import EndpointPicker

log = logging.getLogger("policyc.gateway")
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
INLINE_BODY_BYTES = 16 * 1024  # bodies larger than this are read and tokenized off the event loop
LLM_VARS = ("model", "prompt_tokens", "max_tokens", "stream")
_http1 = ep.ProcessingResponse()
_http1.request_headers.response.header_mutation.set_headers.add(
    header=base_pb2.HeaderValue(key=UPSTREAM_HEADER, raw_value=HTTP1.encode()), append_action=_OVERWRITE)
_http1.request_headers.response.clear_route_cache = True
HTTP1_HEADERS = _http1.SerializeToString()
_ERROR_TYPES = {400: "invalid_request_error", 403: "permission_error", 429: "rate_limit_error"}


@dataclass
class LlmPicks:
    """What the picker needs for LLM bodies: the models' tokenizers and context limits (a
    model's context from its contract unless given here)."""

    tokenizers: Tokenizers = field(default_factory=Tokenizers)
    contexts: dict[str, int] = field(default_factory=dict)
    max_body_bytes: int = 4 << 20  # beyond: 413 (the bootstrap's `LlmRoutes.max_body_bytes`)
    # model -> the registry generation at which its instances' `model_dir` was looked at for a tokenizer
    tried: dict[str, int] = field(default_factory=dict)
    # the last requests read, by decision id (bounded): what tests, the audit and the demo show
    recent: dict[str, LlmRequest] = field(default_factory=dict)

    def remember(self, decision_id: str, req: LlmRequest) -> None:
        if len(self.recent) >= 4096:
            self.recent.pop(next(iter(self.recent)))
        self.recent[decision_id] = req


def body_kind(req: ep.ProcessingRequest) -> str | None:
    """`chat` / `completions` when this request's headers are on a path whose body the
    picker reads (its `:path`, which Envoy sends among the first headers)."""
    for h in req.request_headers.headers.headers:
        if h.key == ":path":
            return path_kind(h.raw_value.decode("latin-1") if h.raw_value else h.value)
    return None


SLO_HEADERS = ("x-slo-ttft-ms", "x-slo-tpot-ms")  # the Inference Extension's per-request token SLOs, in ms
MAX_SLO_MS = 600_000


def _slo_ms(req: ep.ProcessingRequest, name: str) -> float | None:
    """A token SLO header in seconds, or BodyError (400) for one that is not 1..600000 ms."""
    text = _header(req, name)
    if text is None:
        return None
    t = text.strip()
    if not t.isdigit() or not 1 <= int(t) <= MAX_SLO_MS:
        raise BodyError(400, f"header `{name}`: `{t[:32]}` is not a whole number of milliseconds from 1 to {MAX_SLO_MS}",
                        name, "invalid_header")
    return int(t) / 1e3


MODEL_DIR_LABEL = "model_dir"  # an LLM instance's label: the model folder (its tokenizer.json) on its host
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*"([^"\\]{1,256})"')


def _model_hint(raw: bytes) -> str | None:
    """The body's `model`, found without parsing it (only to look for its tokenizer first)."""
    m = _MODEL_FIELD.search(raw[:4096])
    return m.group(1).decode("utf-8", "replace") if m else None


def _header(req: ep.ProcessingRequest, name: str) -> str | None:
    for h in req.request_headers.headers.headers:
        if h.key.lower() == name:
            return h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return None


def _set(mutation: Any, key: str, value: str) -> None:
    mutation.set_headers.add(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE)


def error_response(status: int, message: str, cause: str, code: str, param: str | None = None,
                   extra: Mapping[str, str] | None = None) -> ep.ProcessingResponse:
    """An immediate answer with the OpenAI error object and the reason in `x-policyc-reason`."""
    body = msgspec.json.encode({"error": {"message": message, "type": _ERROR_TYPES.get(status, "server_error"),
                                   "param": param, "code": code}})
    ir = ep.ImmediateResponse(body=body, details=f"policyc_{cause}")
    ir.status.code = status  # type: ignore[assignment]
    _set(ir.headers, REASON_HEADER, ascii_line(message))
    _set(ir.headers, CAUSE_HEADER, cause)
    _set(ir.headers, "content-type", "application/json")
    for k, v in (extra or {}).items():
        _set(ir.headers, k, v)
    return ep.ProcessingResponse(immediate_response=ir)


def as_openai_error(resp: ep.ProcessingResponse, where: Callable[[str], str | None] = lambda _: None) -> ep.ProcessingResponse:
    """A picker refusal (plain-text body) with the OpenAI error object as its body instead;
    the rules that refused it named with where they are written (`where`: rule id -> file:line)."""
    ir = resp.immediate_response
    headers = {h.header.key: h.header.raw_value.decode("utf-8", "replace") for h in ir.headers.set_headers}
    cause = headers.pop(CAUSE_HEADER, "refused")
    headers.pop(REASON_HEADER, None)
    message = ir.body.decode("utf-8", "replace")
    sources = [f"`{r}` at {w}" for r in headers.get(RULE_HEADER, "").split(",") if r and (w := where(r))]
    if sources:
        message += f" ({'; '.join(sources)})"
    return error_response(ir.status.code or 500, message, cause, cause, None, headers)


def request_facts(r: LlmRequest, kind: str, ttft_s: float | None) -> RequestFacts:
    """What the pick reads about this one request (`placer/request_facts.py`): its prompt's
    leading blocks, its tokens and its first-token budget in seconds."""
    return RequestFacts(prefix_blocks(prompt_text(kind, r.body)), float(r.prompt.tokens), ttft_s)


class LlmPicker:
    def __init__(self, picker: "EndpointPicker", picks: LlmPicks) -> None:
        self.picker = picker
        self.picks = picks

    def _bundle_vars(self) -> Callable[[str], bool]:
        bundle = self.picker.service.engine.state.bundle
        declared = {h.var for h in bundle.headers}
        from policyc.compiler.attributes import BUILTIN_REQUEST_VARS
        declared |= set(BUILTIN_REQUEST_VARS)
        return declared.__contains__

    def _rule_source(self, rule_id: str) -> str | None:
        """`file:line` of a rule of the bundle (what a refusal names)."""
        for r in self.picker.service.engine.state.bundle.rules:
            if r.id == rule_id:
                return f"{r.origin.file}:{r.origin.line}"
        return None

    def _context_of(self, model: str) -> int | None:
        given = self.picks.contexts.get(model)
        if given is not None:
            return given
        c = self.picker.service.engine.state.bundle.contract(model)
        llm = getattr(c, "llm", None) if c is not None else None
        ctx = getattr(llm, "context", None) if llm is not None else None
        return int(ctx) if ctx else None

    def _discover_tokenizer(self, model: str) -> None:
        """A model without a tokenizer: the one its registered instances' `model_dir` label
        names (`policyc modelserver --engine vllm --register` sets it), loaded once, if this
        machine has it (a registrant is an operator: registering needs the operator token)."""
        tried, generation = self.picks.tried, self.picker.service.engine.generation
        if tried.get(model) == generation or self.picks.tokenizers.tokenizer(model) is not None:
            return
        tried[model] = generation  # looked at again once the registry changes
        for inst in self.picker.service.engine.state.registry.routable():
            folder = inst.labels.get(MODEL_DIR_LABEL)
            if inst.model == model and folder and (Path(folder) / "tokenizer.json").is_file():
                try:
                    self.picks.tokenizers.register(model, Path(folder))
                    return
                except TokenizerError as e:
                    log.warning("picker: %s's tokenizer from instance %s: %s", model, inst.id, e)

    def read(self, headers: ep.ProcessingRequest, body: bytes, kind: str) -> LlmRequest:
        bundle = self.picker.service.engine.state.bundle
        model = _model_hint(body) or _header(headers, "x-model")
        if model is not None and bundle.contract(model) is not None:
            self._discover_tokenizer(model)
        r = parse_llm_body(body, kind, self.picks.tokenizers, _header(headers, "x-model"),
                           lambda m: bundle.contract(m) is not None, self._context_of)
        ttft, tpot = (_slo_ms(headers, name) for name in SLO_HEADERS)
        return replace(r, ttft_s=ttft, tpot_s=tpot) if ttft is not None or tpot is not None else r

    def ttft_budget_ms(self, r: LlmRequest) -> int | None:
        """A stream's first-token budget: its `x-slo-ttft-ms`, else its contract's `llm.ttft`."""
        if r.ttft_s is not None:
            return max(1, int(r.ttft_s * 1e3))
        c = self.picker.service.engine.state.bundle.contract(r.model)
        ttft = c.llm.ttft if c is not None and c.llm is not None else None
        return max(1, int(ttft * 1e3)) if ttft is not None else None

    def attributes(self, r: LlmRequest) -> dict[str, Scalar]:
        """The body's facts as the request variables this bundle declares."""
        has = self._bundle_vars()
        values: dict[str, Scalar] = {"model": r.model, "prompt_tokens": float(r.prompt.tokens), "stream": r.stream}
        if r.max_tokens is not None:
            values["max_tokens"] = float(r.max_tokens)
        return {k: v for k, v in values.items() if has(k)}

    async def pick(self, headers: ep.ProcessingRequest, body: bytes,
                   kind: str) -> tuple[list[ep.ProcessingResponse], "Pick | None"]:
        """The answers to the request's headers and body (the forward with the pick: the headers'
        answer, then the body given back), or the one refusal; and the pick."""
        size = len(body)
        if size > self.picks.max_body_bytes:
            self.picker._count("bad-body")
            return [too_large(size, self.picks.max_body_bytes)], None
        try:
            if size > INLINE_BODY_BYTES:  # tokenized in a worker: the loop serves others
                r = await asyncio.to_thread(self.read, headers, body, kind)
            else:
                r = self.read(headers, body, kind)
        except BodyError as e:
            self.picker._count("bad-body")
            return [error_response(e.status, e.message, "bad-body", e.code, e.param)], None
        # the prompt's leading blocks and TTFT SLO, for the pick's prefix-affinity and predicted-TTFT signals
        # (placer/request_facts.py: per request, beside the shape's shared decision)
        ttft_ms = self.ttft_budget_ms(r)  # the request's x-slo-ttft-ms, else its contract's llm.ttft
        ttft = ttft_ms / 1e3 if ttft_ms is not None else None
        facts = request_facts(r, kind, ttft) if size <= INLINE_BODY_BYTES else \
            await asyncio.to_thread(request_facts, r, kind, ttft)
        token = CURRENT_FACTS.set(facts)
        try:
            resp, pick = await self.picker._request_headers(headers, self.attributes(r))
        finally:
            CURRENT_FACTS.reset(token)
        if pick is None:
            msg = resp if isinstance(resp, ep.ProcessingResponse) else ep.ProcessingResponse.FromString(resp)
            return [as_openai_error(msg, self._rule_source)], None  # no pick is always a refusal (`_request_headers`)
        self.picks.remember(pick.decision_id, r)
        return self.forward(pick, resp, r, body, _header(headers, UPSTREAM_HEADER) is not None), pick

    def _protocol(self, pick: "Pick") -> str:
        try:
            inst = self.picker.service.engine.state.registry.get(pick.instance_id)
        except Exception:  # noqa: BLE001 - removed since the pick: its protocol as registered is unknown, h2
            return "h2"
        return inst.labels.get(PROTOCOL_LABEL, "h2")

    def headers_answer(self, resp: ep.ProcessingResponse | bytes, pick: "Pick") -> ep.ProcessingResponse | bytes:
        """A headers pick (every path but the body-reading ones: `/v1/models`, OIP REST, gRPC)
        onto an HTTP/1.1 endpoint: the pick's answer with `x-policyc-upstream: http1` and a
        fresh route. Appended serialized (protobuf merges concatenated messages)."""
        if self._protocol(pick) != HTTP1:
            return resp
        return (resp if isinstance(resp, bytes) else resp.SerializeToString()) + HTTP1_HEADERS

    def forward(self, pick: "Pick", resp: ep.ProcessingResponse | bytes, r: LlmRequest, body: bytes,
                forged: bool = False) -> list[ep.ProcessingResponse]:
        """The pick's answer to the request's headers (its endpoint, route and budget), then the
        body given back in one piece (full duplex: Envoy keeps none of it; without it the
        server would get an empty body). Envoy drops `content-length` itself in this mode and
        sends the body chunked, so a body the gateway rewrote needs no new length."""
        headers_answer = resp if isinstance(resp, ep.ProcessingResponse) else ep.ProcessingResponse.FromString(resp)
        out = ep.ProcessingResponse()
        common = out.request_headers.response
        common.CopyFrom(headers_answer.request_headers.response)
        if headers_answer.HasField("dynamic_metadata"):
            out.dynamic_metadata.CopyFrom(headers_answer.dynamic_metadata)
        if self._protocol(pick) == HTTP1:
            _set(common.header_mutation, UPSTREAM_HEADER, HTTP1)
            common.clear_route_cache = True
        elif forged:  # the client's own header chose the route: remove it and route again
            common.header_mutation.remove_headers.append(UPSTREAM_HEADER)
            common.clear_route_cache = True
        ttft_ms = self.ttft_budget_ms(r) if r.stream else None
        if ttft_ms is not None:  # a stream's attempt is held to its first token (llm_stream.py): that is its budget
            m = common.header_mutation
            kept = [h for h in m.remove_headers if h != PER_TRY_TIMEOUT]
            del m.remove_headers[:]
            m.remove_headers.extend(kept)
            _set(m, PER_TRY_TIMEOUT, str(ttft_ms))
        new_body = upstream_body(r)
        return [out, body_answer(new_body if new_body is not None else body)]


def body_answer(body: bytes) -> ep.ProcessingResponse:
    """The whole request body given back to Envoy, ending the stream (full duplex)."""
    out = ep.ProcessingResponse()
    sr = out.request_body.response.body_mutation.streamed_response
    sr.body = body
    sr.end_of_stream = True
    return out


def too_large(size: int, limit: int) -> ep.ProcessingResponse:
    """413 for a body of at least `size` bytes (refused as its pieces arrive, so maybe not all of it)."""
    return error_response(413, f"the request body reached {size} bytes, over the gateway's limit of {limit} bytes",
                          "bad-body", "request_too_large")
