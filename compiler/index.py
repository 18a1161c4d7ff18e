"""The index plan: which structure serves each instance attribute the rules read.

equality → inverted postings (bitmaps per value); set → the same postings, unioned;
range → an ordered structure; boolean → one bitmap. The plan is an optimisation the
matcher may follow; its answer must equal evaluating the rules instance by instance.
"""

from __future__ import annotations

from .attributes import attribute_type
from .bundle import HeaderMapping, IndexedAttribute, RequestRule
from .semantics import atoms

_RANK = {"boolean": 0, "equality": 1, "set": 2, "range": 3}


def plan_index(rules: list[RequestRule], headers: list[HeaderMapping]) -> tuple[IndexedAttribute, ...]:
    header_of = {h.var: h.header for h in headers}
    kinds: dict[str, str] = {}
    fed: dict[str, set[str]] = {}
    used: dict[str, set[str]] = {}
    for rule in rules:
        for a in atoms(rule.require):
            t = attribute_type(a.attr)
            if t == "bool":
                kind = "boolean"
            elif a.cmp in ("<", "<=", ">", ">="):
                kind = "range"
            elif a.cmp in ("in", "not_in"):
                kind = "set"
            else:
                kind = "equality"
            if a.attr not in kinds or _RANK[kind] > _RANK[kinds[a.attr]]:
                kinds[a.attr] = kind
            used.setdefault(a.attr, set()).add(rule.id)
            if a.operand.kind == "var" and a.operand.name in header_of:
                fed.setdefault(a.attr, set()).add(header_of[a.operand.name])
    return tuple(
        IndexedAttribute(attr=attr, kind=kinds[attr], type=attribute_type(attr), fed_by=tuple(sorted(fed.get(attr, ()))),  # type: ignore[arg-type]
                         used_by=tuple(sorted(used[attr])))
        for attr in sorted(kinds)
    )
