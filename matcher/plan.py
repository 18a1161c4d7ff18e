"""Per-request-shape plans: what a request needs, worked out once and reused.

Which rules apply, the Bloom keys to probe and the bitmap terms to intersect depend only on
the request's typed variables (which are present and their values), never on the fleet.
A `Plan` holds them for one such request, bound to its values; a small LRU keyed by the
typed request (`PlanCache`) hands the same plan to every later request of that shape, so
a repeated request pays one dict look-up instead of running every guard.

A plan also keeps the candidate bitmap it last computed together with the index's
membership version at that time. Any insert or delete bumps the version, and a plan whose
version is behind recomputes its candidates from its terms before answering (score
changes do not touch candidates: best-k reads the live score tiers on every request). So a
cached answer is never stale, and a fleet that changes between two requests costs the
second one its intersections, not its planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable, Mapping

from pyroaring import BitMap

from policyc.compiler.bundle import Scalar

from .bloom import BloomKey
from .result import AppliedRule

if TYPE_CHECKING:  # index.py builds plans and imports this module
    from .index import CompiledRule

PLAN_CACHE_SIZE = 512
Term = Callable[[Mapping[str, Scalar]], BitMap]


@dataclass(slots=True, eq=False)
class Plan:
    """The planned work for one typed request; the mutable fields are its answer cache."""

    vars: Mapping[str, Scalar]  # the request's own values (a private copy)
    rules: tuple[CompiledRule, ...]  # the rules that apply, in bundle order
    applied: tuple[AppliedRule, ...]
    terms: tuple[Term, ...]  # one requirement bitmap per applied rule (evaluated at `vars`)
    clauses: tuple[frozenset[BloomKey], ...]  # Bloom keys every admitted instance carries
    version: int = -1  # index membership version of `cand`
    cand: BitMap | None = None  # may be the index's own bitmap: never mutate
    count: int = 0
    bloom_version: int = -1  # filter version of `survivors`
    survivors: BitMap | None = None  # shards the filters cannot rule out (None: no keys)


class PlanCache:
    """A small LRU of plans keyed by the typed request, `tuple(vars.items())`.

    Values that compare equal hash equal (`1.0` and `True`); the rules' comparisons treat
    such values identically too, so sharing a plan between them changes no answer. A key
    holding an unhashable value raises `TypeError` from `get`: the caller plans afresh."""

    __slots__ = ("size", "_plans", "hits", "misses")

    def __init__(self, size: int = PLAN_CACHE_SIZE) -> None:
        self.size = size
        self._plans: dict[Hashable, Plan] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Plan | None:
        plans = self._plans
        plan = plans.pop(key, None)
        if plan is None:
            self.misses += 1
            return None
        plans[key] = plan  # most recently used last
        self.hits += 1
        return plan

    def put(self, key: Hashable, plan: Plan) -> None:
        if self.size <= 0:
            return
        plans = self._plans
        if len(plans) >= self.size:
            del plans[next(iter(plans))]
        plans[key] = plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
