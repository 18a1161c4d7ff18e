"""Decision drafts straight to their stored JSON, without building pydantic models.

The writer process used to turn every draft into a `DecisionRecord` (pydantic validation)
and dump it back to JSON: on this project's 2-vCPU machine about half of its CPU per
record, and there the two vCPUs share one core, so that CPU is taken from the decision
service. Drafts from the decision service (`server.audit_bridge.draft_of`) are already in
the record's canonical shape: the model's field order, exact types, nothing to coerce. For
such a draft this module checks the constraints the model declares (with C-level set and
arithmetic operations rather than a Python call per value), builds the dict
`model_dump(exclude_none=True)` would give, and writes it with pydantic-core's own JSON
writer (`to_json`), so strings, floats and key order come out byte for byte as
`model_dump_json(exclude_none=True)` writes them (the tests compare the two).

Anything outside that shape (an int where a float is declared, another key order, an
unknown key, a missing field, a value the model would refuse or coerce) gives `None`: the
caller then takes the pydantic path, which coerces it or reports the problem exactly as
before. This module never decides that a draft is invalid; it only recognises drafts that
are plainly valid.
"""

from __future__ import annotations

from math import isfinite
from typing import Any

from pydantic_core import to_json

from .schemas import DECISION_SCHEMA

_DECISION_KEYS = frozenset({
    "schema_version", "time", "decision_id", "tenant", "model", "request", "variables", "bundle_hash", "outcome",
    "reason", "matched_rules", "placement", "latency", "resources",
})
_OUTCOMES = frozenset({"admitted", "rejected", "failed"})
_SOURCES = frozenset({"measured", "estimated"})
_RULE_ORDER = ("id", "origin")
_ORIGIN_ORDER = ("file", "line", "col")
_PLACEMENT_TEXT = ("instance", "host", "gpu", "gpu_model", "region")
_PLACEMENT_KEYS = frozenset({*_PLACEMENT_TEXT, "share", "predicted_latency"})
_LATENCY_KEYS = frozenset({"total", "stages"})
_RESOURCE_ORDER = ("gpu_seconds", "memory_bytes", "network_bytes")
_RESOURCE_KEYS = frozenset(_RESOURCE_ORDER)
_FIGURE_KEYS = frozenset({"value", "source", "method", "low", "high"})
_STR = frozenset({str})
_FLOAT = frozenset({float})
_VARIABLE = frozenset({str, bool, float})
_TEXT_OR_NONE = frozenset({str, type(None)})


class _NotCanonical(Exception):
    """The draft is outside the shape this module writes; pydantic decides."""


def encode_draft(draft: Any) -> bytes | None:
    """`DecisionRecord.model_validate(draft).model_dump_json(exclude_none=True)` as UTF-8
    bytes for a draft in canonical shape, or None when pydantic must decide."""
    try:
        record = _record(draft)
    except (_NotCanonical, KeyError):
        return None
    try:
        return to_json(record)
    except ValueError:  # e.g. a lone surrogate: pydantic's path reports it in its own words
        return None


def _finite(*values: float) -> bool:
    """Whether every (float) value is finite: one sum, conservative (an overflowing sum of
    huge finite values says no, and pydantic then decides)."""
    return isfinite(sum(values))


def _record(d: Any) -> dict[str, Any]:
    if type(d) is not dict or not d.keys() <= _DECISION_KEYS:
        raise _NotCanonical
    get = d.get
    t, decision_id, tenant, model = d["time"], d["decision_id"], d["tenant"], get("model")
    bundle_hash, outcome, reason = d["bundle_hash"], d["outcome"], get("reason")
    if (type(t) is not float or not isfinite(t) or type(decision_id) is not str or not decision_id
            or type(tenant) is not str or type(bundle_hash) is not str or type(outcome) is not str
            or outcome not in _OUTCOMES or get("schema_version", DECISION_SCHEMA) != DECISION_SCHEMA
            or not {type(model), type(reason)} <= _TEXT_OR_NONE):
        raise _NotCanonical
    request, variables = get("request", {}), get("variables", {})
    if (type(request) is not dict or not {*map(type, request), *map(type, request.values())} <= _STR
            or type(variables) is not dict or not {*map(type, variables)} <= _STR):
        raise _NotCanonical
    kinds = {*map(type, variables.values())}
    if not kinds <= _VARIABLE or (float in kinds and not _finite(*(v for v in variables.values() if type(v) is float))):
        raise _NotCanonical
    out: dict[str, Any] = {"schema_version": DECISION_SCHEMA, "time": t, "decision_id": decision_id, "tenant": tenant}
    if model is not None:
        out["model"] = model
    out["request"], out["variables"], out["bundle_hash"], out["outcome"] = request, variables, bundle_hash, outcome
    if reason is not None:
        out["reason"] = reason
    out["matched_rules"] = _rules(get("matched_rules", ()))
    placement = get("placement")
    if placement is not None:
        out["placement"] = _placement(placement)
    out["latency"] = _latency(d["latency"])
    out["resources"] = _resources(get("resources", {}))
    return out


def _rules(rules: Any) -> Any:
    if type(rules) is not list and type(rules) is not tuple:
        raise _NotCanonical
    for r in rules:
        if type(r) is not dict or tuple(r) != _RULE_ORDER or type(r["id"]) is not str:
            raise _NotCanonical
        o = r["origin"]
        if type(o) is not dict or tuple(o) != _ORIGIN_ORDER or type(o["file"]) is not str \
                or type(o["line"]) is not int or type(o["col"]) is not int:
            raise _NotCanonical
    return rules


def _placement(p: Any) -> dict[str, Any]:
    if type(p) is not dict or not p.keys() <= _PLACEMENT_KEYS:
        raise _NotCanonical
    out = {k: p[k] for k in _PLACEMENT_TEXT if p.get(k) is not None}
    if not {*map(type, out.values())} <= _STR:
        raise _NotCanonical
    share, predicted = p.get("share"), p.get("predicted_latency")
    if share is not None:
        if type(share) is not float or not 0 < share <= 1:
            raise _NotCanonical
        out["share"] = share
    if predicted is not None:
        if type(predicted) is not float or not isfinite(predicted):
            raise _NotCanonical
        out["predicted_latency"] = predicted
    return out


def _latency(lat: Any) -> dict[str, Any]:
    if type(lat) is not dict or not lat.keys() <= _LATENCY_KEYS:
        raise _NotCanonical
    total, stages = lat["total"], lat.get("stages", {})
    if type(total) is not float or not isfinite(total) or total < 0 or type(stages) is not dict:
        raise _NotCanonical
    if stages and (not {*map(type, stages)} <= _STR or not {*map(type, stages.values())} <= _FLOAT
                   or not _finite(*stages.values())):
        raise _NotCanonical
    return {"total": total, "stages": stages}


def _resources(res: Any) -> dict[str, Any]:
    if type(res) is not dict or not res.keys() <= _RESOURCE_KEYS:
        raise _NotCanonical
    return {k: _figure(res[k]) for k in _RESOURCE_ORDER if res.get(k) is not None}


def _figure(f: Any) -> dict[str, Any]:
    if type(f) is not dict or not f.keys() <= _FIGURE_KEYS:
        raise _NotCanonical
    value, source, method, low, high = f["value"], f["source"], f["method"], f.get("low"), f.get("high")
    if (type(value) is not float or not isfinite(value) or value < 0 or type(source) is not str
            or source not in _SOURCES or type(method) is not str):
        raise _NotCanonical
    out = {"value": value, "source": source, "method": method}
    for k, v in (("low", low), ("high", high)):
        if v is not None:
            if type(v) is not float or not isfinite(v):
                raise _NotCanonical
            out[k] = v
    return out
