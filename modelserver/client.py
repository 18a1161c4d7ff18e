"""A small Open Inference Protocol client for policyc's model servers (directly, or through
a gateway): build a `ModelInferRequest` for a model, send it, read the answer — the
logits, and which instance answered with which variant, in how long.

    with OipClient("127.0.0.1:40123") as c:
        a = c.infer("fraud-scorer", token_ids(16), metadata=[("x-tenant", "acme-bank")])
        a.instance, a.variant, a.compute_us

gRPC answers are read from the OIP response parameters and checked against the response
metadata (`x-policyc-*`); REST answers (`rest_body` / `parse_rest_answer`) likewise from
the JSON body and the HTTP headers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import grpc
import numpy as np

from . import wire
from .model_files import MAX_LEN, VOCAB
from .oip import InferenceStub, pb

Metadata = Sequence[tuple[str, str]]


class AnswerError(ValueError):
    """A response that is not a policyc model server's answer, or contradicts itself."""


@dataclass(frozen=True, slots=True)
class Answer:
    model: str
    request_id: str
    instance: str
    variant: str
    compute_us: int
    retry_count: int
    stalled_ms: int
    logits: np.ndarray
    headers: dict[str, str] = field(default_factory=dict)  # response metadata / headers, lower-case keys
    decision_id: str = ""  # the decision the gateway's picker sent it under (empty: none)


def token_ids(length: int, *, batch: int = 1, seed: int = 0) -> np.ndarray:
    """A valid `input_ids[batch, length]` for the pool's reference models."""
    if not 1 <= length <= MAX_LEN:
        raise ValueError(f"length must be in 1..{MAX_LEN}, got {length}")
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, length), dtype=np.int64)


def infer_request(model: str, ids: np.ndarray | Sequence[Sequence[int]], *, request_id: str = "") -> pb.ModelInferRequest:
    """A `ModelInferRequest` for `model` with `input_ids` as raw INT64 contents."""
    arr = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
    if arr.ndim != 2:
        raise ValueError(f"input_ids must be [batch, sequence], got shape {list(arr.shape)}")
    tensor = pb.ModelInferRequest.InferInputTensor(name=wire.INPUT_NAME, datatype="INT64", shape=list(arr.shape))
    return pb.ModelInferRequest(model_name=model, id=request_id, inputs=[tensor], raw_input_contents=[arr.tobytes()])


def _param(p: Any) -> str | int | bool:
    kind = p.WhichOneof("parameter_choice")
    if kind is None:
        raise AnswerError("an empty OIP parameter")
    return getattr(p, kind)  # type: ignore[no-any-return]


def _answer(model: str, request_id: str, params: Mapping[str, Any], logits: np.ndarray,
            headers: Mapping[str, str]) -> Answer:
    missing = [k for k in (wire.PARAM_INSTANCE, wire.PARAM_VARIANT, wire.PARAM_COMPUTE_US) if k not in params]
    if missing:
        raise AnswerError(f"answer from model `{model}` lacks {', '.join(f'`{k}`' for k in missing)}: "
                          "not a policyc model server")
    a = Answer(model=model, request_id=request_id, instance=str(params[wire.PARAM_INSTANCE]),
               variant=str(params[wire.PARAM_VARIANT]), compute_us=int(params[wire.PARAM_COMPUTE_US]),
               retry_count=int(params.get(wire.PARAM_RETRY_COUNT, 0)), stalled_ms=int(params.get(wire.PARAM_STALLED_MS, 0)),
               logits=logits, headers={k.lower(): v for k, v in headers.items()},
               decision_id=str(params.get(wire.PARAM_DECISION_ID, "")))
    for header, value in ((wire.INSTANCE, a.instance), (wire.VARIANT, a.variant)):
        seen = a.headers.get(header)
        if seen is not None and seen != value:
            raise AnswerError(f"answer says {header} `{seen}` in its headers but `{value}` in its parameters")
    return a


def parse_answer(response: pb.ModelInferResponse, metadata: Iterable[tuple[str, str]] = ()) -> Answer:
    """An Answer from a gRPC `ModelInferResponse` and its initial metadata."""
    params = {k: _param(v) for k, v in response.parameters.items()}
    outputs = {o.name: n for n, o in enumerate(response.outputs)}
    if wire.OUTPUT_NAME not in outputs:
        raise AnswerError(f"answer from model `{response.model_name}` has no output `{wire.OUTPUT_NAME}`")
    n = outputs[wire.OUTPUT_NAME]
    out = response.outputs[n]
    if len(response.raw_output_contents) > n:
        logits = np.frombuffer(response.raw_output_contents[n], dtype=np.float32)
    else:
        logits = np.asarray(out.contents.fp32_contents, dtype=np.float32)
    return _answer(response.model_name, response.id, params, logits.reshape(list(out.shape)), dict(metadata))


def rest_body(ids: np.ndarray | Sequence[Sequence[int]], *, request_id: str = "") -> bytes:
    """The JSON body of `POST /v2/models/<model>/infer` for `input_ids`."""
    arr = np.asarray(ids, dtype=np.int64)
    body: dict[str, Any] = {"inputs": [{"name": wire.INPUT_NAME, "datatype": "INT64", "shape": list(arr.shape),
                                        "data": arr.ravel().tolist()}]}
    if request_id:
        body["id"] = request_id
    return json.dumps(body).encode()


def parse_rest_answer(body: bytes | Mapping[str, Any], headers: Mapping[str, str]) -> Answer:
    """An Answer from a v2 REST JSON response and its HTTP headers."""
    data = json.loads(body) if isinstance(body, (bytes, str)) else body
    try:
        out = next(o for o in data["outputs"] if o["name"] == wire.OUTPUT_NAME)
        logits = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    except (KeyError, StopIteration, TypeError, ValueError) as e:
        raise AnswerError(f"REST answer has no readable output `{wire.OUTPUT_NAME}`: {e}") from None
    return _answer(str(data.get("model_name", "")), str(data.get("id", "")), data.get("parameters") or {}, logits,
                   headers)


class OipClient:
    """A gRPC OIP client over one channel (one HTTP/2 connection, streams multiplexed)."""

    def __init__(self, target: str | grpc.Channel) -> None:
        self._own = isinstance(target, str)
        self.channel = grpc.insecure_channel(target) if isinstance(target, str) else target
        self.stub = InferenceStub(self.channel)

    def infer(self, model: str, ids: np.ndarray | Sequence[Sequence[int]], *, metadata: Metadata = (),
              timeout: float = 10.0, request_id: str = "") -> Answer:
        """Send one request and read its answer; grpc.RpcError as the server (or gateway) said."""
        response, call = self.stub.ModelInfer.with_call(infer_request(model, ids, request_id=request_id),
                                                        metadata=list(metadata), timeout=timeout)
        return parse_answer(response, call.initial_metadata() or ())

    def infer_future(self, model: str, ids: np.ndarray | Sequence[Sequence[int]], *, metadata: Metadata = (),
                     timeout: float = 10.0, request_id: str = "") -> grpc.Future:
        """Start one request; `answer_of(future)` reads it. Concurrent calls share the channel."""
        return self.stub.ModelInfer.future(infer_request(model, ids, request_id=request_id),
                                           metadata=list(metadata), timeout=timeout)

    def server_ready(self, timeout: float = 5.0) -> bool:
        return bool(self.stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout).ready)

    def model_ready(self, name: str, timeout: float = 5.0) -> bool:
        return bool(self.stub.ModelReady(pb.ModelReadyRequest(name=name), timeout=timeout).ready)

    def close(self) -> None:
        if self._own:
            self.channel.close()

    def __enter__(self) -> OipClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def answer_of(future: grpc.Future) -> Answer:
    """The Answer of a call started with `infer_future` (raises its grpc.RpcError)."""
    response = future.result()
    return parse_answer(response, future.initial_metadata() or ())
