"""Decision drafts straight to their stored JSON, without building pydantic models.

The writer process used to turn every draft into a `DecisionRecord` (pydantic validation
into seven nested model instances) and dump it back to JSON. On this project's 2-vCPU
machine the two vCPUs share one core, so the writer's CPU per record is taken from the
decision service. Drafts from the decision service (`server.audit_bridge.draft_of`) are
already plain values of the right types, so this module validates them with a pydantic-core
schema that mirrors `DecisionRecord` field for field but is *strict* and yields plain dicts
(no model instances), and writes them with that schema's serializer (`exclude_none`): the
same JSON writer as `model_dump_json(exclude_none=True)`, fields in the model's order, so
the stored bytes are the same (the tests compare the two on real and random drafts).

A draft the strict schema refuses (an int where a str is declared, an unknown key, a
missing field, a value out of range) gives `None`: the caller then takes the pydantic path,
which coerces it or reports the problem in its usual words. This module never reports a
draft invalid; it only recognises drafts that are plainly valid.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticSerializationError, SchemaSerializer, SchemaValidator, ValidationError
from pydantic_core import core_schema as cs

from .schemas import DECISION_SCHEMA

_STR = cs.str_schema(strict=True)
_INT = cs.int_schema(strict=True)


def _float(**bounds: float) -> cs.FloatSchema:
    return cs.float_schema(strict=True, allow_inf_nan=False, **bounds)  # type: ignore[arg-type]


def _optional(schema: cs.CoreSchema, default: Any = None) -> cs.TypedDictField:
    return cs.typed_dict_field(cs.with_default_schema(schema, default=default), required=False)


def _nullable(schema: cs.CoreSchema) -> cs.TypedDictField:
    return _optional(cs.nullable_schema(schema))


def _required(schema: cs.CoreSchema) -> cs.TypedDictField:
    return cs.typed_dict_field(schema, required=True)


def _record(fields: dict[str, cs.TypedDictField]) -> cs.TypedDictSchema:
    """A model as a strict dict: extra keys refused, fields kept in declaration order."""
    return cs.typed_dict_schema(fields, strict=True, extra_behavior="forbid")


# `records.Figure`, `SourceRef`, `MatchedRule`, `Placement`, `Latency`, `Resources`,
# `DecisionRecord`, in their field order (the order the JSON is written in).
_FIGURE = _record({
    "value": _required(_float(ge=0)),
    "source": _required(cs.literal_schema(["measured", "estimated"])),
    "method": _required(_STR),
    "low": _nullable(_float()),
    "high": _nullable(_float()),
})
_ORIGIN = _record({"file": _required(_STR), "line": _required(_INT), "col": _required(_INT)})
_RULE = _record({"id": _required(_STR), "origin": _required(_ORIGIN)})
_PLACEMENT = _record({
    **{k: _nullable(_STR) for k in ("instance", "host", "gpu", "gpu_model", "region")},
    "share": _nullable(_float(gt=0, le=1)),
    "predicted_latency": _nullable(_float()),
})
_LATENCY = _record({
    "total": _required(_float(ge=0)),
    "stages": _optional(cs.dict_schema(_STR, _float(), strict=True), {}),
})
_RESOURCES = _record({k: _nullable(_FIGURE) for k in ("gpu_seconds", "memory_bytes", "network_bytes")})
_DECISION = _record({
    "schema_version": _optional(cs.literal_schema([DECISION_SCHEMA]), DECISION_SCHEMA),
    "time": _required(_float()),
    "decision_id": _required(cs.str_schema(strict=True, min_length=1)),
    "tenant": _required(_STR),
    "model": _nullable(_STR),
    "request": _optional(cs.dict_schema(_STR, _STR, strict=True), {}),
    "variables": _optional(cs.dict_schema(_STR, cs.union_schema([_STR, cs.bool_schema(strict=True), _float()]), strict=True), {}),
    "bundle_hash": _required(_STR),
    "outcome": _required(cs.literal_schema(["admitted", "rejected", "failed"])),
    "reason": _nullable(_STR),
    "matched_rules": _optional(cs.list_schema(_RULE), []),
    "placement": _nullable(_PLACEMENT),
    "latency": _required(_LATENCY),
    "resources": _optional(_RESOURCES, {}),
})
_VALIDATE = SchemaValidator(_DECISION).validate_python
_SERIALISE = SchemaSerializer(_DECISION).to_json


def encode_draft(draft: Any) -> bytes | None:
    """`DecisionRecord.model_validate(draft).model_dump_json(exclude_none=True)` as UTF-8
    bytes for a draft the strict schema accepts, or None when pydantic must decide."""
    try:
        return _SERIALISE(_VALIDATE(draft), exclude_none=True)
    except (ValidationError, PydanticSerializationError):
        return None
