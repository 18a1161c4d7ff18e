"""Decision drafts: a decision record as plain values, validated and serialised by the
writer process instead of the decision thread.

Building a `DecisionRecord` (pydantic validation) and dumping it to JSON costs a decision
thread ~70 µs, about a tenth of a whole decision, and holds the interpreter lock that every
other decision thread needs. A draft is a dict literal of the same fields (a few µs); the
writer process turns it into the same record, through the same validation and the same
redaction, so the stored bytes are those `submit_decision` would have stored. It crosses
the pipe as MessagePack, so it must hold plain values. The price:
a draft that does not validate is refused there, asynchronously, and reported through its
receipt, `AuditLog.failures` and the `policyc.audit` logger, not by an exception at the call.
"""

from __future__ import annotations

from typing import Iterable, Mapping, TypedDict

from .schemas import DECISION_SCHEMA


class FigureFields(TypedDict, total=False):
    value: float
    source: str  # "measured" | "apportioned" | "estimated"
    method: str
    low: float
    high: float


class DecisionDraft(TypedDict, total=False):
    """The JSON shape of a `DecisionRecord` (see `records.py` for each field's meaning)."""

    schema_version: str
    time: float
    decision_id: str
    tenant: str
    model: str | None
    request: dict[str, str]
    variables: dict[str, str | float | bool]
    bundle_hash: str
    outcome: str
    reason: str | None
    matched_rules: list[dict[str, object]]
    rejected_by: list[dict[str, object]]
    placement: dict[str, object] | None
    latency: dict[str, object]
    resources: dict[str, FigureFields]


def decision_draft(
    *,
    time: float,
    decision_id: str,
    tenant: str,
    model: str | None,
    headers: Mapping[str, str],
    variables: Mapping[str, str | float | bool],
    bundle_hash: str,
    outcome: str,
    reason: str | None,
    matched_rules: Iterable[tuple[str, str, int, int, int, int]],
    placement: Mapping[str, object] | None,
    latency: float,
    stages: Mapping[str, float],
    resources: Mapping[str, FigureFields] | None = None,
    rejected_by: Iterable[tuple[str, str, tuple[str, int, int, int, int] | None]] | None = None,
) -> DecisionDraft:
    """A draft from the decision's parts. `matched_rules`: (rule id, file, line, col, end line, end col);
    `placement`: the `Placement` fields that are known; `resources`: as `estimated_figures`
    returns (None: nothing estimated or measured); `rejected_by`: a rejection's (stage, rule id,
    (file, line, col, end line, end col) or None), left out of the draft when None."""
    draft: DecisionDraft = {
        "schema_version": DECISION_SCHEMA,
        "time": time,
        "decision_id": decision_id,
        "tenant": tenant,
        "model": model,
        "request": dict(headers),
        "variables": dict(variables),
        "bundle_hash": bundle_hash,
        "outcome": outcome,
        "reason": reason,
        "matched_rules": [{"id": i, "origin": {"file": f, "line": ln, "col": c, "end_line": el, "end_col": ec}}
                          for i, f, ln, c, el, ec in matched_rules],
        "placement": dict(placement) if placement is not None else None,
        "latency": {"total": latency, "stages": dict(stages)},
        # written even when empty, as the record's default is: the writer's fast path wants every field that has a default other than None
        "resources": dict(resources) if resources is not None else {},
    }
    if rejected_by is not None:
        draft["rejected_by"] = [{"stage": st, "id": i, **({"origin": dict(zip(_ORIGIN, o))} if o is not None else {})}
                                for st, i, o in rejected_by]
    return draft


_ORIGIN = ("file", "line", "col", "end_line", "end_col")
