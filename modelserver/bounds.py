"""What one inference request may ask of a model server, checked before any compute.

A single REST request of shape `[2048, 64]` (300 KB of valid token ids) once grew a server
by 1.7 GB, held its event loop for the whole of its JSON answer and killed the process
with every instance in it; a gRPC `[4096, 64]` ran 25 s before its answer was refused for
its size. Every request is now held to bounds its model and contract declare, and
refused before decoding its data or running anything when it exceeds one:

- **sequence**: at most the model's longest sequence (its position table, `wpe`);
- **tokens** (batch × sequence): at most the contract's `compute.tokens` — the request
  size its FLOPs, its latency budget and the decision that placed it were computed for
  (so the batch is bounded too: at most that many sequences of one token);
- **tensor bytes**: the input's data must be exactly what its shape says (INT64: 8 bytes
  an id), and a REST body at most `rest_body_bytes` (the largest legal JSON body);
- **answer bytes**: the answer's size, computed from the model's output shape for this
  input (`logits[batch, sequence, vocab]`, FP32) before running, at most
  `--max-answer-bytes` as it travels (binary over gRPC, `JSON_BYTES_PER_VALUE` a value as
  REST JSON).

A request over a bound is `TooLarge` (REST 413, gRPC `INVALID_ARGUMENT`), one that is
malformed — a negative or non-integer dim, string or out-of-int64 data, data that does
not match its shape — `Malformed` (REST 400, gRPC `INVALID_ARGUMENT`). Both name the
bound or the problem in one line. Nothing here imports KServe (the REST guard and the
tests use it); `onnx_model` and `serve` raise these as KServe's `InvalidInput`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any
from dataclasses import dataclass

from . import wire

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT64_BYTES = 8
JSON_BYTES_PER_INT = 22  # "-9223372036854775808, "
JSON_BYTES_PER_VALUE = 25  # a float32 as JSON text: "-1.2345678901234567e-05, "
JSON_OVERHEAD = 64 * 1024  # the rest of a REST body: names, parameters, an id, whitespace
DEFAULT_MAX_ANSWER_BYTES = 4 << 20
# The largest gRPC message a model server takes: a request over its bounds but under this
# gets INVALID_ARGUMENT naming the bound; a larger one gRPC itself refuses (RESOURCE_EXHAUSTED,
# "received message larger than max"). 4 MiB holds a [4096, 64] request's raw ids twice.
GRPC_MAX_RECEIVE = 4 << 20
GRPC_MAX_SEND = 8 << 20  # an answer's message: `--max-answer-bytes` stays under it
ANSWER_ENVELOPE = 64 * 1024  # an answer's message besides its tensor (parameters, names)
MAX_RANK = 8  # any shape with more dims is refused before its dims are multiplied


class BoundError(ValueError):
    """A request refused before compute; `status` is its REST status."""

    status = 400


class Malformed(BoundError):
    """Not a request the model can read: wrong name, type, shape or data."""


class TooLarge(BoundError):
    """A request over one of the declared bounds (REST 413)."""

    status = 413


Dim = int | str  # a fixed size or a symbolic name


@dataclass(frozen=True, slots=True)
class Bounds:
    """One served model's bounds (see the module docstring), and what it needs to compute
    an answer's size: its input's and output's dims (symbolic names shared between them)
    and the output's bytes per value."""

    model: str
    max_sequence: int
    max_tokens: int
    max_answer_bytes: int
    input_dims: tuple[Dim, ...] = ("batch", "sequence")
    output_dims: tuple[Dim, ...] = ("batch", "sequence", -1)
    output_itemsize: int = 4
    output_datatype: str = "FP32"

    @property
    def input_bytes(self) -> int:
        """The largest input tensor (binary INT64)."""
        return self.max_tokens * INT64_BYTES

    @property
    def rest_body_bytes(self) -> int:
        """The largest REST body a legal request needs (every id written at its longest)."""
        return JSON_OVERHEAD + self.max_tokens * JSON_BYTES_PER_INT

    def answer_shape(self, batch: int, sequence: int) -> list[int]:
        """The output's shape for an input `[batch, sequence]`, from the model's dims."""
        values: dict[str, int] = {}
        for dim, v in zip(self.input_dims, (batch, sequence)):
            if isinstance(dim, str):
                values[dim] = v
        out: list[int] = []
        for dim in self.output_dims:
            if isinstance(dim, int) and dim >= 0:
                out.append(dim)
            elif isinstance(dim, str) and dim in values:
                out.append(values[dim])
            else:  # checked when the model is loaded (see `output_follows_input`)
                raise TooLarge(f"model `{self.model}`: the answer's size does not follow from the input")
        return out

    def answer_bytes(self, batch: int, sequence: int, *, json: bool) -> int:
        n = 1
        for d in self.answer_shape(batch, sequence):
            n *= d
        return n * (JSON_BYTES_PER_VALUE if json else self.output_itemsize)


def output_follows_input(input_dims: Sequence[Dim], output_dims: Sequence[Dim]) -> str | None:
    """None when every output dim is fixed or named by an input dim; else the problem."""
    named = {d for d in input_dims if isinstance(d, str)}
    for i, d in enumerate(output_dims):
        if isinstance(d, int) and d >= 0:
            continue
        if isinstance(d, str) and d in named:
            continue
        return f"output dim {i} (`{d}`) is neither fixed nor an input dim: the answer's size cannot be known before running"
    return None


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_shape(shape: Sequence[object], bounds: Bounds) -> tuple[int, int]:
    """`(batch, sequence)` of an `input_ids` shape, or Malformed / TooLarge naming why."""
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK:
        raise Malformed(f"input `{wire.INPUT_NAME}`: shape must be [batch, sequence], got "
                        f"{'a ' + type(shape).__name__ if not isinstance(shape, (list, tuple)) else f'{len(shape)} dims'}")
    bad = [x for x in shape if not _is_int(x) or not 0 <= x <= INT64_MAX]  # type: ignore[operator]
    if bad:
        shown = ", ".join(f"`{_show(x)}`" if isinstance(x, str) else _show(x) for x in bad[:3])
        raise Malformed(f"input `{wire.INPUT_NAME}`: shape dims must be non-negative integers, got {shown}")
    dims = [int(x) for x in shape]  # type: ignore[call-overload]
    if len(dims) != 2 or 0 in dims:
        raise Malformed(f"input `{wire.INPUT_NAME}`: shape must be [batch, sequence], got {dims}")
    batch, sequence = dims
    if sequence > bounds.max_sequence:
        raise TooLarge(f"input `{wire.INPUT_NAME}`: sequence of {sequence} is longer than {bounds.max_sequence} "
                       f"(the longest model `{bounds.model}` takes)")
    if batch * sequence > bounds.max_tokens:
        raise TooLarge(f"input `{wire.INPUT_NAME}`: shape {dims} is {batch * sequence} tokens; model `{bounds.model}` "
                       f"takes at most {bounds.max_tokens} a request (its contract's compute.tokens), "
                       f"so at most {bounds.max_tokens // sequence} sequences of {sequence}")
    return batch, sequence


def check_answer(batch: int, sequence: int, bounds: Bounds, *, json: bool) -> None:
    """TooLarge when the answer to `[batch, sequence]` would exceed `max_answer_bytes`."""
    size = bounds.answer_bytes(batch, sequence, json=json)
    if size > bounds.max_answer_bytes:
        shape = bounds.answer_shape(batch, sequence)
        form = f"as JSON, {JSON_BYTES_PER_VALUE} bytes a value" if json else bounds.output_datatype
        raise TooLarge(f"the answer to shape [{batch}, {sequence}] would be {wire.OUTPUT_NAME}{shape} "
                       f"({size} bytes {form}), over this server's bound of {bounds.max_answer_bytes} bytes "
                       "(--max-answer-bytes)")


def check_header(name: str, datatype: object) -> None:
    if name != wire.INPUT_NAME:
        raise Malformed(f"takes one input `{wire.INPUT_NAME}`, got `{_show(name)}`")
    if datatype != "INT64":
        raise Malformed(f"input `{wire.INPUT_NAME}`: datatype must be INT64, got {_show(datatype)}")


def check_ids(values: Sequence[object], expected: int) -> None:
    """REST JSON data, flattened: `expected` integers within INT64."""
    if len(values) != expected:
        raise Malformed(f"input `{wire.INPUT_NAME}`: data holds {len(values)} values; its shape says {expected}")
    for i, x in enumerate(values):
        if not _is_int(x):
            kind = f"the string `{_show(x)}`" if isinstance(x, str) else _show(x)
            raise Malformed(f"input `{wire.INPUT_NAME}`: data[{i}] is {kind}, not an integer token id")
        if not INT64_MIN <= x <= INT64_MAX:  # type: ignore[operator]
            raise Malformed(f"input `{wire.INPUT_NAME}`: data[{i}] = {_show(x)} is beyond INT64")


def flatten(data: object, limit: int) -> list[object]:
    """A REST tensor's `data` (flat, or nested lists in row-major order) as one list;
    Malformed past `limit` values or 64 levels (never a recursion)."""
    if not isinstance(data, list):
        raise Malformed(f"input `{wire.INPUT_NAME}`: data must be a list of token ids, got {_show(data)}")
    out: list[object] = []
    stack: list[Iterator[object]] = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                if len(stack) >= 64:
                    raise Malformed(f"input `{wire.INPUT_NAME}`: data nested deeper than 64 lists")
                stack.append(iter(x))
                break
            out.append(x)
            if len(out) > limit:
                raise Malformed(f"input `{wire.INPUT_NAME}`: data holds more than the {limit} values its shape says")
        else:
            stack.pop()
    return out


def _show(x: object) -> str:
    """A value from a request, short and printable, for a message."""
    if isinstance(x, str):
        text = x
    elif isinstance(x, int) and not isinstance(x, bool):
        text = str(x) if abs(x) < 10**30 else f"an integer of {len(str(abs(x)))} digits"
    else:
        text = repr(x)
    text = text.encode("ascii", "backslashreplace").decode()
    return text if len(text) <= 40 else text[:37] + "..."


def check_grpc(request: Any, bounds: Bounds) -> None:
    """A gRPC `ModelInferRequest` against `bounds`, before KServe decodes its contents:
    one INT64 `input_ids`, a shape within bounds, an answer within bounds, and contents
    (raw bytes or `int64_contents`) exactly as large as the shape says."""
    names = [t.name for t in request.inputs]
    if len(names) != 1:
        raise Malformed(f"takes one input `{wire.INPUT_NAME}`, got " + (", ".join(f"`{_show(n)}`" for n in names[:4]) or "none"))
    t = request.inputs[0]
    check_header(t.name, t.datatype)
    batch, sequence = check_shape(list(t.shape), bounds)
    check_answer(batch, sequence, bounds, json=False)
    n = batch * sequence
    raw = request.raw_input_contents
    if len(raw) > 1:
        raise Malformed(f"{len(raw)} raw_input_contents for one input")
    if raw:
        if len(raw[0]) != n * INT64_BYTES:
            raise Malformed(f"input `{wire.INPUT_NAME}`: raw_input_contents holds {len(raw[0])} bytes; "
                            f"shape [{batch}, {sequence}] INT64 is {n * INT64_BYTES}")
        return
    given = [f.name for f, _ in t.contents.ListFields()]
    if given and given != ["int64_contents"]:
        raise Malformed(f"input `{wire.INPUT_NAME}`: INT64 data goes in int64_contents or raw_input_contents, got "
                        + ", ".join(given))
    count = len(t.contents.int64_contents)
    if count != n:
        raise Malformed(f"input `{wire.INPUT_NAME}`: int64_contents holds {count} values; shape [{batch}, {sequence}] is {n}")
