"""Explain a decision: which rule, and which predicate of it, eliminated which part of the
fleet. For the decision API's `Explain`, for auditors, and for `policyc test` reasons.

Counts are over the live fleet: `eliminated` is what a rule's requirement excludes on its
own; `eliminated_in_order` is what it excludes of what the earlier applied rules left (in
bundle order, so the column sums to live − count); each predicate's `failing` is how many
live instances fail that atom alone.
"""

from __future__ import annotations

from typing import Mapping

from policyc.compiler.bundle import Scalar

from policyc.compiler.semantics import atoms, guard_holds
from .index import FleetIndex, render
from .result import Explanation, PredicateCount, RuleExplanation


def explain(ix: FleetIndex, vars: Mapping[str, Scalar]) -> Explanation:
    live = ix.live
    n = len(live)
    left = live
    out: list[RuleExplanation] = []
    applied = []
    for cr in ix.rules:
        rule = cr.rule
        absent = sorted(v for v in cr.reads if v not in vars)
        if absent:
            why = "request variable " + ", ".join(f"`{v}`" for v in absent) + " is absent"
        elif rule.guard is not None and not guard_holds(rule.guard, vars):
            why = "guard is false"
        else:
            why = "applies"
        if why != "applies":
            out.append(RuleExplanation(rule.id, rule.origin, False, why, 0, 0, ()))
            continue
        applied.append(cr)
        ok = cr.require(vars) & live
        before = len(left)
        left = left & ok
        preds = tuple(
            PredicateCount(render(a), a.origin, n - len(ix._compile_atom(a)(vars) & live))
            for a in atoms(rule.require)
        )
        out.append(RuleExplanation(rule.id, rule.origin, True, why, n - len(ok), before - len(left), preds))
    survivors = ix.shard_survivors(applied, vars)
    shards = len(ix.bloom.shards)
    skipped = 0 if survivors is None else shards - len(survivors)
    return Explanation(live=n, count=len(left), rules=tuple(out), shards=shards, shards_skipped_by_bloom=skipped)
