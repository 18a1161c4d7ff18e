"""What refused a rejected decision, for its audit record (`DecisionRecord.rejected_by`):
the rules of the bundle the rejection names, each with its source, so a report can group
rejections by rule id and show the rule's line (`audit/html_report.py`), and an export
can carry them per record (`audit/export.py`).

Every rejection kind gets at least one entry, so no rejected record is left without one:
- feasibility: the rules in Z3's unsat core (with their spans); a request outside the
  declared domain, or an LLM prompt no GPU class can prefill within its TTFT: the
  declaration that refused it (the header's or the contract's span), under the stage's name;
- match: the applied rules that exclude live instances, with their spans; a request the
  rules admit but no reachable instance can serve (nothing registered, no endpoint in the
  gateway's pool or subset): the stage's name, no rule;
- placement: `placement:<binding constraint>` (e.g. `placement:gpu_share`) at the span of
  the contract whose placement failed.
"""

from __future__ import annotations

from policyc.compiler.bundle import Bundle, SourceRef

from .decision import Decision, Stage

# (stage, id, origin or None)
Rejecting = tuple[str, str, SourceRef | None]

_memo: dict[int, tuple[object, tuple[Rejecting, ...]]] = {}
_MEMO_MAX = 4096


def rejected_by(d: Decision, bundle: Bundle) -> tuple[Rejecting, ...] | None:
    """The entries for `d`'s record; None when `d` was not rejected. Memoised by the
    rejection object (the engine shares one per request shape for feasibility and match)."""
    rej = d.rejection
    if rej is None:
        return None
    got = _memo.get(id(rej))
    if got is not None and got[0] is rej:
        return got[1]
    stage = rej.stage.value
    out: tuple[Rejecting, ...]
    if rej.rule_ids:
        spans: tuple[SourceRef | None, ...] = rej.spans if len(rej.spans) == len(rej.rule_ids) else (None,) * len(rej.rule_ids)
        out = tuple((stage, i, s) for i, s in zip(rej.rule_ids, spans))
    elif rej.stage is Stage.PLACEMENT:
        contract = bundle.contract(d.model or "")
        out = ((stage, f"placement:{rej.binding or 'unknown'}", contract.origin if contract is not None else None),)
    elif rej.spans:
        out = tuple((stage, stage, s) for s in rej.spans)
    else:
        out = ((stage, stage, None),)
    if rej.stage is not Stage.PLACEMENT:  # a placement refusal is made per decision: nothing to share
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        _memo[id(rej)] = (rej, out)
    return out
