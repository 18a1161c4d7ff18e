"""Decision drafts straight to their stored JSON, without building pydantic models.

The writer process used to turn every draft into a `DecisionRecord` (pydantic validation)
and dump it back to JSON: ~70 µs of its CPU per record, and on a machine whose vCPUs share
one core that CPU is taken from the decision service. Drafts from the decision service
(`server.audit_bridge.draft_of`) are already in the record's canonical shape: exact types,
no coercion needed. For such a draft this module checks the same constraints the model
declares and writes the bytes `model_dump_json(exclude_none=True)` would write, in the
model's field order, with pydantic-core's float format (checked against it in the tests).

Anything outside that shape (an int where a float is declared, an unknown key, a missing
field, a value the model would refuse or coerce) gives `None`: the caller then takes the
pydantic path, which coerces it or reports the problem exactly as before. The fast path
never decides that a draft is *invalid*; it only recognises drafts that are plainly valid.
"""

from __future__ import annotations

from json.encoder import encode_basestring
from math import isfinite
from typing import Any

from .schemas import DECISION_SCHEMA

_DECISION_KEYS = frozenset({
    "schema_version", "time", "decision_id", "tenant", "model", "request", "variables", "bundle_hash", "outcome",
    "reason", "matched_rules", "placement", "latency", "resources",
})
_REQUIRED = ("time", "decision_id", "tenant", "bundle_hash", "outcome", "latency")
_OUTCOMES = frozenset({"admitted", "rejected", "failed"})
_SOURCES = frozenset({"measured", "estimated"})
_RULE_KEYS = frozenset({"id", "origin"})
_ORIGIN_KEYS = frozenset({"file", "line", "col"})
_PLACEMENT_TEXT = ("instance", "host", "gpu", "gpu_model", "region")
_PLACEMENT_KEYS = frozenset({*_PLACEMENT_TEXT, "share", "predicted_latency"})
_LATENCY_KEYS = frozenset({"total", "stages"})
_RESOURCE_KEYS = ("gpu_seconds", "memory_bytes", "network_bytes")
_FIGURE_KEYS = frozenset({"value", "source", "method", "low", "high"})
_HEAD = '{"schema_version":' + encode_basestring(DECISION_SCHEMA) + ',"time":'


class _NotCanonical(Exception):
    """The draft is outside the shape this module writes; pydantic decides."""


def encode_draft(draft: Any) -> str | None:
    """`DecisionRecord.model_validate(draft).model_dump_json(exclude_none=True)` for a
    draft in canonical shape, or None when pydantic must decide (coerce or refuse)."""
    try:
        return _record(draft)
    except _NotCanonical:
        return None


def _float(x: Any) -> str:
    """A finite float as pydantic-core writes it: Python's shortest repr, except that a
    negative exponent loses its leading zero and 1e-5..1e-4 is written out in full."""
    if type(x) is not float or not isfinite(x):
        raise _NotCanonical
    r = repr(x)
    if "e-" not in r:
        return r
    mantissa, exp = r.split("e-")
    if exp == "05":
        sign = "-" if mantissa[0] == "-" else ""
        return sign + "0.0000" + mantissa.lstrip("-").replace(".", "")
    return mantissa + "e-" + exp.lstrip("0")


def _str(x: Any) -> str:
    if type(x) is not str:
        raise _NotCanonical
    return encode_basestring(x)


def _int(x: Any) -> str:
    if type(x) is not int:
        raise _NotCanonical
    return str(x)


def _member(x: Any, allowed: frozenset[str]) -> bool:
    return type(x) is str and x in allowed


def _dict(x: Any, keys: frozenset[str]) -> dict[str, Any]:
    if type(x) is not dict or not x.keys() <= keys:
        raise _NotCanonical
    return x


def _record(d: Any) -> str:
    d = _dict(d, _DECISION_KEYS)
    for k in _REQUIRED:
        if k not in d:
            raise _NotCanonical
    if "schema_version" in d and d["schema_version"] != DECISION_SCHEMA:
        raise _NotCanonical
    if type(d["decision_id"]) is not str or not d["decision_id"] or not _member(d["outcome"], _OUTCOMES):
        raise _NotCanonical
    out = [_HEAD, _float(d["time"]), ',"decision_id":', _str(d["decision_id"]), ',"tenant":', _str(d["tenant"])]
    model = d.get("model")
    if model is not None:
        out += ',"model":', _str(model)
    out += ',"request":', _text_map(d.get("request", {}))
    out += ',"variables":', _variables(d.get("variables", {}))
    out += ',"bundle_hash":', _str(d["bundle_hash"]), ',"outcome":', _str(d["outcome"])
    reason = d.get("reason")
    if reason is not None:
        out += ',"reason":', _str(reason)
    out += ',"matched_rules":', _rules(d.get("matched_rules", ()))
    placement = d.get("placement")
    if placement is not None:
        out += ',"placement":', _placement(placement)
    out += ',"latency":', _latency(d["latency"]), ',"resources":', _resources(d.get("resources", {})), "}"
    return "".join(out)


def _text_map(m: Any) -> str:
    if type(m) is not dict:
        raise _NotCanonical
    return "{" + ",".join(_str(k) + ":" + _str(v) for k, v in m.items()) + "}"


def _variable(v: Any) -> str:
    t = type(v)
    if t is str:
        return encode_basestring(v)
    if t is bool:
        return "true" if v else "false"
    return _float(v)


def _variables(m: Any) -> str:
    if type(m) is not dict:
        raise _NotCanonical
    return "{" + ",".join(_str(k) + ":" + _variable(v) for k, v in m.items()) + "}"


def _rules(rules: Any) -> str:
    if type(rules) is not list and type(rules) is not tuple:
        raise _NotCanonical
    parts = []
    for r in rules:
        if type(r) is not dict or r.keys() != _RULE_KEYS:
            raise _NotCanonical
        o = r["origin"]
        if type(o) is not dict or o.keys() != _ORIGIN_KEYS:
            raise _NotCanonical
        parts.append('{"id":' + _str(r["id"]) + ',"origin":{"file":' + _str(o["file"]) + ',"line":' + _int(o["line"])
                     + ',"col":' + _int(o["col"]) + "}}")
    return "[" + ",".join(parts) + "]"


def _placement(p: Any) -> str:
    p = _dict(p, _PLACEMENT_KEYS)
    parts = []
    for k in _PLACEMENT_TEXT:
        v = p.get(k)
        if v is not None:
            parts.append('"' + k + '":' + _str(v))
    share = p.get("share")
    if share is not None:
        text = _float(share)
        if not 0 < share <= 1:
            raise _NotCanonical
        parts.append('"share":' + text)
    predicted = p.get("predicted_latency")
    if predicted is not None:
        parts.append('"predicted_latency":' + _float(predicted))
    return "{" + ",".join(parts) + "}"


def _latency(lat: Any) -> str:
    lat = _dict(lat, _LATENCY_KEYS)
    if "total" not in lat:
        raise _NotCanonical
    total = _float(lat["total"])
    if lat["total"] < 0:
        raise _NotCanonical
    stages = lat.get("stages", {})
    if type(stages) is not dict:
        raise _NotCanonical
    return '{"total":' + total + ',"stages":{' + ",".join(_str(k) + ":" + _float(v) for k, v in stages.items()) + "}}"


def _resources(res: Any) -> str:
    if type(res) is not dict or not res.keys() <= frozenset(_RESOURCE_KEYS):
        raise _NotCanonical
    parts = []
    for k in _RESOURCE_KEYS:
        fig = res.get(k)
        if fig is not None:
            parts.append('"' + k + '":' + _figure(fig))
    return "{" + ",".join(parts) + "}"


def _figure(f: Any) -> str:
    f = _dict(f, _FIGURE_KEYS)
    if "value" not in f or "method" not in f or not _member(f.get("source"), _SOURCES):
        raise _NotCanonical
    value = _float(f["value"])
    if f["value"] < 0:
        raise _NotCanonical
    text = '{"value":' + value + ',"source":"' + f["source"] + '","method":' + _str(f["method"])
    for k in ("low", "high"):
        v = f.get(k)
        if v is not None:
            text += ',"' + k + '":' + _float(v)
    return text + "}"
