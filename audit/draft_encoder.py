"""Decision drafts on the wire and into their stored JSON, without building pydantic models.

On this project's 2-vCPU machine the two vCPUs share one core, so every microsecond the
writer process spends on a record is taken from the decision service. A draft therefore
crosses the pipe as MessagePack (`wire_draft`, msgspec's encoder: about half the cost of
the `marshal` it replaces on the decision thread) and the writer validates it into msgspec
structs that mirror `records.DecisionRecord` field for field and writes their JSON
(`encode_draft`: ~10 µs where pydantic-core took ~35 and the pydantic models ~50).

The structs are *strict* (no coercion, unknown keys refused) and leave out None fields
(`omit_defaults`, every default being None), so what they accept they write exactly as
`DecisionRecord.model_dump_json(exclude_none=True)` does: fields in the model's order,
the same string escapes and float digits. Two differences are handled by handing the draft
back (None): msgspec writes a float of 1e16 or more as `1e16` where pydantic writes `1e+16`,
so the structs refuse such floats; and fields whose model default is not None
(`schema_version`, `request`, `variables`, `matched_rules`, `latency.stages`, `resources`)
are required here, so a draft without them takes the pydantic path, which writes the
defaults. The tests compare both paths on real and random drafts, and fail if the structs
drift from the models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, NamedTuple, Sequence

import msgspec
from msgspec import Meta, Struct

from .index_columns import IndexRow

# Every struct below is strict (forbid_unknown_fields), leaves out its None fields
# (omit_defaults), takes keywords only (kw_only: so a required field may follow one with a
# default, as in the models) and is not tracked by the collector (gc=False: drafts hold plain
# values and never sit in a reference cycle; cheaper to build and decode, less collector work
# in a busy service). The options are written out on each class, where mypy reads them.
# From 1e16 on both write an exponent, msgspec `1e16` and pydantic `1e+16` (below it the
# same digits, tested): larger floats are refused here, in C, and take the pydantic path.
_LARGE = 1e16
_Float = Annotated[float, Meta(gt=-_LARGE, lt=_LARGE)]
_NonNegative = Annotated[float, Meta(ge=0, lt=_LARGE)]


class FigureWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):  # records.Figure
    value: _NonNegative
    source: Literal["measured", "apportioned", "estimated"]
    method: str
    low: _Float | None = None
    high: _Float | None = None


class OriginWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):  # compiler.bundle.SourceRef
    file: str
    line: int
    col: int
    end_line: int  # 0: a point; required here (the record writes its default): a draft without it takes the model's path
    end_col: int


class RuleWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):  # records.MatchedRule
    id: str
    origin: OriginWire


class RejectingWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):  # records.RejectingRule
    stage: Literal["feasibility", "match", "placement"]
    id: str
    origin: OriginWire | None = None


class PlacementWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):  # records.Placement
    instance: str | None = None
    host: str | None = None
    gpu: str | None = None
    gpu_model: str | None = None
    region: str | None = None
    share: Annotated[float, Meta(gt=0, le=1)] | None = None
    predicted_latency: _Float | None = None


class LatencyWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):  # records.Latency
    total: _NonNegative
    stages: dict[str, _Float]


class ResourcesWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):  # records.Resources
    gpu_seconds: FigureWire | None = None
    memory_bytes: FigureWire | None = None
    network_bytes: FigureWire | None = None
    compute_seconds: FigureWire | None = None


class DecisionWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):  # records.DecisionRecord
    schema_version: Literal["policyc.audit.decision/v1"]
    time: _Float
    decision_id: Annotated[str, Meta(min_length=1)]
    tenant: str
    model: str | None = None
    request: dict[str, str]
    variables: dict[str, str | _Float | bool]
    bundle_hash: str
    outcome: Literal["admitted", "rejected", "failed"]
    reason: str | None = None
    matched_rules: list[RuleWire]
    rejected_by: list[RejectingWire] | None = None
    placement: PlacementWire | None = None
    latency: LatencyWire
    resources: ResourcesWire


_WIRE = msgspec.msgpack.Encoder().encode
_DECODE = msgspec.msgpack.Decoder(DecisionWire).decode
_DECODE_MANY = msgspec.msgpack.Decoder(list[DecisionWire]).decode
_LOOSE = msgspec.msgpack.Decoder().decode
_JSON = msgspec.json.Encoder()
_ENCODE = _JSON.encode


def wire_draft(draft: Mapping[str, Any] | DecisionWire) -> bytes:
    """A draft as its frame carries it (decision side): MessagePack, which keeps every
    value a draft may hold as it is (str and bytes apart, non-finite floats) and which
    msgspec writes and reads faster than JSON. Plain values only: str, bytes, int, float,
    bool, None, dicts, lists and tuples; raises TypeError for anything else."""
    try:
        return _WIRE(draft)
    except (TypeError, UnicodeEncodeError, OverflowError) as e:
        raise TypeError(f"audit draft must hold only dicts, lists, tuples, str, int, float, bool and None ({e})") from None


def wire_drafts(drafts: Sequence[Mapping[str, Any] | DecisionWire]) -> bytes:
    """Many drafts as one MessagePack array (one call for the whole batch)."""
    return wire_draft(drafts if isinstance(drafts, list) else list(drafts))  # type: ignore[arg-type]


class EncodedDraft(NamedTuple):
    body: bytes  # `DecisionRecord.model_dump_json(exclude_none=True)` as UTF-8, before redaction
    headers: dict[str, str]  # the request headers, for redaction
    columns: IndexRow  # the body's index columns, as `index_columns.index_row(body)` gives them (not `index`: tuple's method)


def _index(r: DecisionWire) -> IndexRow:
    """`index_columns.index_row` of the record's body, without parsing it again (tested equal)."""
    res, p = r.resources, r.placement
    g, m, n = res.gpu_seconds, res.memory_bytes, res.network_bytes
    return (
        "decision", r.time, r.decision_id, r.tenant, r.model, p.region if p is not None else None, r.outcome, None,
        g.value if g else None, g.source if g else None, m.value if m else None, m.source if m else None,
        n.value if n else None, n.source if n else None, r.latency.total,
    )


def encode_draft(payload: bytes) -> EncodedDraft | None:
    """The stored JSON of a wire draft the strict structs accept, or None when pydantic
    must decide."""
    try:
        r = _DECODE(payload)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return EncodedDraft(_ENCODE(r), r.request, _index(r))


def encode_drafts(payload: bytes | memoryview) -> list[EncodedDraft] | None:
    """`encode_draft` for a `wire_drafts` batch, in two calls to msgspec for the whole
    batch (decode, then one JSON line per record: JSON escapes newlines inside strings).
    None when any draft of it needs pydantic: the caller then takes them one by one."""
    try:
        records = _DECODE_MANY(payload)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    bodies = _JSON.encode_lines(records).split(b"\n")
    return [EncodedDraft(b, r.request, _index(r)) for b, r in zip(bodies, records)]


def split_drafts(payload: bytes | memoryview) -> list[bytes]:
    """A `wire_drafts` batch as single wire drafts (the slow path after `encode_drafts`
    refused it). Raises ValueError if it is not a MessagePack array."""
    items = draft_values(bytes(payload))
    if not isinstance(items, list):
        raise ValueError("decision drafts are not a MessagePack array")
    return [_WIRE(item) for item in items]


def draft_values(payload: bytes) -> Any:
    """The wire draft as plain values, for the pydantic path. Raises ValueError if it is not MessagePack."""
    try:
        return _LOOSE(payload)
    except msgspec.DecodeError as e:
        raise ValueError(f"decision draft is not MessagePack ({e})") from None
