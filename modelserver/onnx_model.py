"""`OnnxModel`: a `kserve.Model` serving one registered instance's ONNX model with
onnxruntime, over whatever protocol KServe received the request on (v2 gRPC or REST).

KServe hands `predict` the decoded `InferRequest` and the request's headers (gRPC
invocation metadata or HTTP headers, lower-cased keys), and, because the model is built
with `return_response_headers=True`, a dict whose entries become response headers (the
REST server sets them; policyc's gRPC servicer sends them as initial metadata). The facts
a caller needs — which instance answered, which variant, how long onnxruntime ran — go
there and into the answer's OIP parameters (see `wire.py`).

Every request is held to its model's `Bounds` (`bounds.py`: sequence, tokens, tensor
bytes, answer bytes) before its data are decoded: over a bound it is refused with
`RequestTooLarge` (REST 413, gRPC INVALID_ARGUMENT), malformed with `InvalidInput`. (The
REST guard and the gRPC servicer check the raw request first; the checks here hold for
any other way in.) A request is computed in the server's compute pool, `COMPUTE_THREADS`
threads (onnxruntime releases the GIL), so the event loop keeps serving the other streams
and clients while one computes or stalls, and at most that many computes hold memory at
once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx
import onnxruntime as ort
from kserve import Model
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from prometheus_client import Counter, Histogram

from policyc.compiler.bundle import Contract
from policyc.onnxgate.contract_metadata import contract_from_model
from policyc.onnxgate.errors import ContractMetadataError

from . import wire
from .bounds import DEFAULT_MAX_ANSWER_BYTES, BoundError, Bounds, TooLarge, check_answer, check_shape, output_follows_input
from .model_files import variant_of
from .refusals import RequestTooLarge

log = logging.getLogger("policyc.modelserver")

ANSWERS = Counter("policyc_modelserver_answers", "inference answers by instance and variant",
                  ["model_name", "instance", "variant"])
STALLS = Counter("policyc_modelserver_stalls", "requests held by stall control", ["instance"])
CANCELLED = Counter("policyc_modelserver_cancelled", "requests whose stream the caller reset before the answer",
                    ["instance"])
COMPUTE = Histogram("policyc_modelserver_compute_seconds", "onnxruntime run time per call", ["instance", "variant"],
                    buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0))


# Computes run here, never on the event loop; threads start on first use (a zygote that
# imported this module forks before any exists).
COMPUTE_THREADS = 4
_COMPUTE = ThreadPoolExecutor(max_workers=COMPUTE_THREADS, thread_name_prefix="policyc-onnx")


class ModelLoadError(RuntimeError):
    """A model file cannot be served (unreadable, no valid contract, variants that disagree)."""


@dataclass(frozen=True, slots=True)
class _Variant:
    name: str
    session: ort.InferenceSession
    vocab: int | None  # ids must be below this (None: the graph does not say)
    max_len: int | None


def _read(path: Path) -> tuple[onnx.ModelProto, Contract]:
    try:
        model = onnx.load_model(str(path))
    except Exception as e:  # onnx raises OSError, DecodeError and its own types
        raise ModelLoadError(f"{path}: not a readable ONNX model: {e}") from None
    try:
        return model, contract_from_model(model, str(path))
    except ContractMetadataError as e:
        raise ModelLoadError(str(e)) from None


def _limits(model: onnx.ModelProto) -> tuple[int | None, int | None]:
    """Vocabulary size and longest sequence, read from the embedding tables when present."""
    dims = {i.name: list(i.dims) for i in model.graph.initializer if i.name in ("wte", "wpe")}
    vocab = dims["wte"][0] if "wte" in dims else None
    max_len = dims["wpe"][0] if "wpe" in dims else None
    return vocab, max_len


def _session(model: onnx.ModelProto, path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    # One thread per call: several instances share a few cores, and concurrency comes from
    # concurrent calls, not from splitting one small call.
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types, not one base
        raise ModelLoadError(f"{path}: onnxruntime cannot load it: {e}") from None


def _count(headers: Mapping[str, str], name: str, lowest: int, highest: int) -> int | None:
    """The integer a count header holds, within [lowest, highest]; InvalidInput naming the
    header otherwise (a value past int64 once reached the answer's parameters and made it
    INTERNAL; a 5,000-digit one was echoed whole)."""
    raw = headers.get(name)
    if raw is None or raw == "":
        return None
    text = raw.strip()
    shown = text[:32].encode("unicode_escape").decode("ascii") + ("..." if len(text) > 32 else "")
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isascii() or not digits.isdigit():
        raise InvalidInput(f"header `{name}`: `{shown}` is not an integer")
    if len(digits) > 18:  # never parsed: far outside any bound
        side = f"below {lowest}" if text[:1] == "-" else f"above {highest}"
        raise InvalidInput(f"header `{name}`: `{shown}` is {side}")
    value = int(text)
    if value < lowest:
        raise InvalidInput(f"header `{name}`: {value} is below {lowest}")
    if value > highest:
        raise InvalidInput(f"header `{name}`: {value} is above {highest}")
    return value


def retry_count(headers: Mapping[str, str]) -> int:
    """How many times this request was retried: `x-retry-count`, or Envoy's attempt count - 1."""
    explicit = _count(headers, wire.RETRY_COUNT, 0, wire.MAX_RETRY_COUNT) or 0
    attempts = _count(headers, wire.ENVOY_ATTEMPT_COUNT, 1, wire.MAX_RETRY_COUNT + 1) or 1
    return max(explicit, attempts - 1)


class OnnxModel(Model):
    """One instance: its full variant, optionally a simplified one served to retries."""

    def __init__(self, full: Path, simplified: Path | None = None, *, name: str | None = None,
                 instance_id: str | None = None, stall_control: bool = False,
                 max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES) -> None:
        model, contract = _read(full)
        if variant_of(model) != wire.FULL:
            raise ModelLoadError(f"{full}: declares variant `{variant_of(model)}`, expected `{wire.FULL}`")
        super().__init__(name or contract.name, return_response_headers=True)
        self.instance_id = instance_id or self.name
        self.contract = contract
        self.full_path = full
        self.simplified_path = simplified
        self.stall_control = stall_control
        self.max_answer_bytes = max_answer_bytes
        self._bounds: Bounds | None = None
        self._models: dict[str, onnx.ModelProto] = {wire.FULL: model}
        if simplified is not None:
            small, small_contract = _read(simplified)
            if small_contract.name != contract.name:
                raise ModelLoadError(f"{simplified}: carries contract `{small_contract.name}`, "
                                     f"but the full variant {full} carries `{contract.name}`")
            if variant_of(small) != wire.SIMPLIFIED:
                raise ModelLoadError(f"{simplified}: declares variant `{variant_of(small)}`, expected `{wire.SIMPLIFIED}`")
            self._models[wire.SIMPLIFIED] = small
        self._variants: dict[str, _Variant] = {}

    def load(self) -> bool:
        paths = {wire.FULL: self.full_path, wire.SIMPLIFIED: self.simplified_path}
        for variant, model in self._models.items():
            path = paths[variant]
            assert path is not None
            vocab, max_len = _limits(model)
            self._variants[variant] = _Variant(variant, _session(model, path), vocab, max_len)
        self._models.clear()
        self._bounds = self._bounds_of(self._variants.values())
        self.ready = True
        return self.ready

    def _bounds_of(self, variants: Any) -> Bounds:
        """The bounds every variant keeps: the shortest longest sequence, the contract's
        tokens, the largest answer (the output dims, read from each session)."""
        found: list[Bounds] = []
        for v in variants:
            (inp,), outs = v.session.get_inputs(), v.session.get_outputs()
            out = next((o for o in outs if o.name == wire.OUTPUT_NAME), None)
            if out is None:
                raise ModelLoadError(f"{self.full_path}: variant `{v.name}` has no output `{wire.OUTPUT_NAME}`")
            in_dims = tuple(d if isinstance(d, (int, str)) else "?" for d in inp.shape)
            out_dims = tuple(d if isinstance(d, (int, str)) else "?" for d in out.shape)
            problem = output_follows_input(in_dims, out_dims)
            if problem is not None:
                raise ModelLoadError(f"{self.full_path}: variant `{v.name}`: {problem}")
            longest = v.max_len if v.max_len is not None else self.contract.compute.tokens
            found.append(Bounds(self.name, max_sequence=longest, max_tokens=self.contract.compute.tokens,
                                max_answer_bytes=self.max_answer_bytes, input_dims=in_dims, output_dims=out_dims))
        # the strictest sequence bound; the answer bound checked against the largest output
        strict = min(found, key=lambda b: b.max_sequence)
        largest = max(found, key=lambda b: b.answer_bytes(1, 1, json=False))
        return Bounds(self.name, strict.max_sequence, strict.max_tokens, self.max_answer_bytes,
                      largest.input_dims, largest.output_dims)

    @property
    def bounds(self) -> Bounds:
        """What one request may ask of this instance (set when loaded)."""
        if self._bounds is None:
            raise RuntimeError(f"model `{self.name}` is not loaded")
        return self._bounds

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self._variants)

    def _input(self, payload: Any, variant: _Variant) -> np.ndarray:
        if not isinstance(payload, InferRequest):
            raise InvalidInput(f"model `{self.name}` speaks the Open Inference Protocol v2 only "
                               f"(POST /v2/models/{self.name}/infer or gRPC ModelInfer)")
        names = [i.name for i in payload.inputs]
        if names != [wire.INPUT_NAME]:
            raise InvalidInput(f"model `{self.name}` takes one input `{wire.INPUT_NAME}`, got "
                               + (", ".join(f"`{n}`" for n in names) or "none"))
        tensor = payload.inputs[0]
        if tensor.datatype != "INT64":
            raise InvalidInput(f"input `{wire.INPUT_NAME}`: datatype must be INT64, got {tensor.datatype}")
        try:  # before the data are decoded: the shape they claim, and the answer it would make
            batch, sequence = check_shape(list(tensor.shape), self.bounds)
            check_answer(batch, sequence, self.bounds, json=not payload.from_grpc)
        except TooLarge as e:
            raise RequestTooLarge(str(e)) from None
        except BoundError as e:
            raise InvalidInput(str(e)) from None
        try:
            ids = tensor.as_numpy()
        except (ValueError, TypeError, OverflowError) as e:
            raise InvalidInput(f"input `{wire.INPUT_NAME}`: data does not match shape {list(tensor.shape)}: {e}") from None
        if ids.ndim != 2 or 0 in ids.shape:
            raise InvalidInput(f"input `{wire.INPUT_NAME}`: shape must be [batch, sequence], got {list(ids.shape)}")
        if variant.max_len is not None and ids.shape[1] > variant.max_len:
            raise InvalidInput(f"input `{wire.INPUT_NAME}`: sequence of {ids.shape[1]} is longer than {variant.max_len}")
        if variant.vocab is not None and (ids.min() < 0 or ids.max() >= variant.vocab):
            raise InvalidInput(f"input `{wire.INPUT_NAME}`: token ids must be in [0, {variant.vocab}), "
                               f"got {int(ids.min())} .. {int(ids.max())}")
        return np.ascontiguousarray(ids, dtype=np.int64)

    def _stall_ms(self, headers: Mapping[str, str], retries: int) -> int:
        if not self.stall_control or retries > 0:  # the header means nothing here: not even read
            return 0
        asked = _count(headers, wire.STALL_MS, 0, wire.MAX_STALL_MS)
        if asked is None:
            return 0
        return asked

    async def predict(self, payload: Any, headers: dict[str, str] | None = None,
                      response_headers: dict[str, str] | None = None) -> InferResponse:
        headers = headers or {}
        retries = retry_count(headers)
        chosen = wire.SIMPLIFIED if retries > 0 and wire.SIMPLIFIED in self._variants else wire.FULL
        variant = self._variants[chosen]
        ids = self._input(payload, variant)
        stall = self._stall_ms(headers, retries)
        started = time.monotonic()
        try:
            if stall:
                STALLS.labels(self.instance_id).inc()
                log.info("instance %s: holding request %s for %d ms (stall control)", self.instance_id,
                         payload.id, stall)
                await asyncio.sleep(stall / 1e3)
            logits, compute_s = await asyncio.get_running_loop().run_in_executor(_COMPUTE, self._run, variant, ids)
        except asyncio.CancelledError:
            CANCELLED.labels(self.instance_id).inc()
            log.info("instance %s: request %s cancelled by the caller after %.0f ms", self.instance_id, payload.id,
                     (time.monotonic() - started) * 1e3)
            raise
        compute_us = int(round(compute_s * 1e6))
        ANSWERS.labels(self.name, self.instance_id, chosen).inc()
        COMPUTE.labels(self.instance_id, chosen).observe(compute_s)
        decision = headers.get(wire.DECISION_ID, "")
        log.info("instance %s answered %s (decision %s): variant %s, retry %d, stalled %d ms, compute %d us",
                 self.instance_id, payload.id, decision or "-", chosen, retries, stall, compute_us)
        facts: dict[str, str | int] = {
            wire.PARAM_INSTANCE: self.instance_id, wire.PARAM_VARIANT: chosen, wire.PARAM_COMPUTE_US: compute_us,
            wire.PARAM_RETRY_COUNT: retries, wire.PARAM_STALLED_MS: stall,
        }
        if decision:
            facts[wire.PARAM_DECISION_ID] = decision
        if response_headers is not None:
            response_headers.update({
                wire.INSTANCE: self.instance_id, wire.VARIANT: chosen, wire.COMPUTE_US: str(compute_us),
                wire.RETRY_SEEN: str(retries), wire.STALLED_MS: str(stall),
            })
        out = InferOutput(name=wire.OUTPUT_NAME, shape=list(logits.shape), datatype="FP32")
        out.set_data_from_numpy(logits, binary_data=payload.from_grpc)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[out],
                             parameters=facts, use_binary_outputs=payload.from_grpc)

    @staticmethod
    def _run(variant: _Variant, ids: np.ndarray) -> tuple[np.ndarray, float]:
        t = time.perf_counter()
        try:
            (logits,) = variant.session.run([wire.OUTPUT_NAME], {wire.INPUT_NAME: ids})
        except Exception as e:  # onnxruntime's errors share no base class
            raise InvalidInput(f"onnxruntime rejected the input: {e}") from None
        return np.asarray(logits, dtype=np.float32), time.perf_counter() - t

    def get_input_types(self) -> list[dict[str, Any]]:
        return [{"name": wire.INPUT_NAME, "datatype": "INT64", "shape": [-1, -1]}]

    def get_output_types(self) -> list[dict[str, Any]]:
        v = self._variants.get(wire.FULL)
        return [{"name": wire.OUTPUT_NAME, "datatype": "FP32", "shape": [-1, -1, v.vocab if v and v.vocab else -1]}]
