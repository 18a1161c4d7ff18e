"""The index columns of an entry, derived from its record's stored JSON.

Queries and reports read `chain.COLUMNS` (tenant, model, region, resources, ...) instead of
parsing every record. In store schema v1 SQLite generated them from the body with
`json_extract` (about 30 parses of the body per row, a third of the writer's CPU); in v2 the
writer computes them here and stores them as plain columns, and `verify` re-derives them
from every entry's body with this same function and names the first entry that disagrees,
so the body (which the hash chain covers) stays their only source.

A column holds a value only when the record has it with the column's type (text for TEXT,
a number for REAL), else NULL: a body can be any JSON, and the rule must give the writer and
`verify` the same answer for every one. Decisions fill the decision columns; actions (and
records of an unknown schema) the action ones, as v1's generated columns did.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
from msgspec import Struct

from .schemas import ACTION_SCHEMA, DECISION_SCHEMA

IndexRow = tuple[Any, ...]  # in `chain.COLUMNS` order: str | float | None each


class _Figure(Struct, gc=False):
    value: float | None = None
    source: str | None = None


class _Placement(Struct, gc=False):
    region: str | None = None


class _Latency(Struct, gc=False):
    total: float | None = None


class _Resources(Struct, gc=False):
    gpu_seconds: _Figure | None = None
    memory_bytes: _Figure | None = None
    network_bytes: _Figure | None = None


class _Body(Struct, gc=False):
    """The parts of a record the columns read; other keys are skipped unparsed."""

    schema_version: str | None = None
    time: float | None = None
    decision_id: str | None = None
    tenant: str | None = None
    model: str | None = None
    outcome: str | None = None
    kind: str | None = None
    placement: _Placement | None = None
    resources: _Resources | None = None
    latency: _Latency | None = None


# gc=False: plain values, never in a cycle, so the collector need not track them (decodes
# ~15 % faster; verify decodes one per entry).
_TYPED = msgspec.json.Decoder(_Body).decode


def index_row(body: bytes) -> IndexRow:
    """The index columns of `body`. Raises ValueError when the body is not JSON."""
    try:
        r = _TYPED(body)
    except msgspec.ValidationError:  # valid JSON of other shapes or types: the slow, exact rule
        return _loose(body)
    except msgspec.DecodeError as e:
        raise ValueError(f"the record is not JSON ({e})") from None
    res = r.resources
    if r.schema_version != DECISION_SCHEMA:  # an `accounting` action carries the call's measured figures
        g, m, n = (res.gpu_seconds, res.memory_bytes, res.network_bytes) if res is not None else (None, None, None)
        return ("action" if r.schema_version == ACTION_SCHEMA else None, r.time, r.decision_id, None, None, None, r.outcome, r.kind,
                g.value if g else None, g.source if g else None, m.value if m else None, m.source if m else None,
                n.value if n else None, n.source if n else None, None)
    g, m, n = (res.gpu_seconds, res.memory_bytes, res.network_bytes) if res is not None else (None, None, None)
    return (
        "decision", r.time, r.decision_id, r.tenant, r.model, r.placement.region if r.placement is not None else None, r.outcome, None,
        g.value if g else None, g.source if g else None, m.value if m else None, m.source if m else None,
        n.value if n else None, n.source if n else None, r.latency.total if r.latency is not None else None,
    )


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _real(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if not math.isnan(f) else None


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"`{name}` is not JSON")


def _loose(body: bytes) -> IndexRow:
    try:  # the standard library's parser: msgspec refuses numbers beyond a float's range
        d = _obj(json.loads(body, parse_constant=_refuse_constant))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"the record is not JSON ({e})") from None
    sv = d.get("schema_version")
    t, did, outcome = _real(d.get("time")), _text(d.get("decision_id")), _text(d.get("outcome"))
    res = _obj(d.get("resources"))
    figs = [_obj(res.get(k)) for k in ("gpu_seconds", "memory_bytes", "network_bytes")]
    if sv != DECISION_SCHEMA:
        return ("action" if sv == ACTION_SCHEMA else None, t, did, None, None, None, outcome, _text(d.get("kind")),
                *(x for f in figs for x in (_real(f.get("value")), _text(f.get("source")))), None)
    return (
        "decision", t, did, _text(d.get("tenant")), _text(d.get("model")), _text(_obj(d.get("placement")).get("region")), outcome, None,
        *(x for f in figs for x in (_real(f.get("value")), _text(f.get("source")))),
        _real(_obj(d.get("latency")).get("total")),
    )
