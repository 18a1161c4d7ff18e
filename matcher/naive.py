"""The baseline: evaluate the compiled rules instance by instance, sort, take k.

The order is the registry's: by score (higher first), then by (model, host, GPU), the
group the score belongs to, then by instance id.

The index must give exactly this answer (same count, same set, same best-k); the
differential tests and `benchmarks/match.py` compare against it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Iterable, Mapping

from policyc.compiler.bundle import Bundle, Scalar

from policyc.compiler.semantics import admits, applicable_rules
from .instance import Instance


@dataclass(frozen=True, slots=True)
class NaiveAnswer:
    ids: frozenset[str]
    best: tuple[str, ...]
    rules: tuple[str, ...]


def naive_match(bundle: Bundle, entries: Iterable[tuple[Instance, Mapping[str, Scalar], float]],
                vars: Mapping[str, Scalar], k: int = 1) -> NaiveAnswer:
    rules = applicable_rules(bundle.rules, vars)
    hits = [(-score, (inst.model, inst.deployment.host, inst.deployment.gpu), inst.id)
            for inst, attrs, score in entries if admits(rules, attrs, vars)]
    best = tuple(i for _, _, i in heapq.nsmallest(k, hits)) if k > 0 else ()
    return NaiveAnswer(frozenset(i for _, _, i in hits), best, tuple(r.id for r in rules))
