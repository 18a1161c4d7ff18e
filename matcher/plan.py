"""Per-request-shape plans: what a request needs, worked out once and reused.

Which rules apply, the Bloom keys to probe and the bitmap terms to intersect depend only on
the request's typed variables (which are present and their values), never on the fleet.
And a quantity compared with a range attribute (`slo_latency <= request.slo`) matters only
through its place among that attribute's distinct values: `X-SLO-Latency: 137.25ms` and
`137.5ms` select the same instances when no instance has an SLO between them. So requests
are keyed by their **reduced shape** (`FleetIndex.shape_key`): exact values, except such a
quantity, which becomes its position among the values (and the version of that value set).

A repeated request finds its plan by its exact values first (`FleetIndex.plans`, the
cheapest key: one tuple of the typed variables). Below that, plans come in two levels, each
in a bounded LRU (`PlanCache`, oldest out one at a time):

- a `Base`, keyed by the reduced shape *without* the range positions: the rules that apply,
  their Bloom clauses and the shards surviving them, and the intersection of every term
  that reads no range position (`model == request.model and region == request.region and
  tpm`). A fleet sees few of these (every family, region and flag combination), so they
  stay warm even when most requests are new. Below that key, bases are kept by what they
  answer (`FleetIndex.effective`: the rules that apply and the values their requirements
  read), which `Registry` fills after each build with every base the bundle's requests
  can produce (`base_catalog.py`), so even a base's first request finds it built;
- a `Plan` per reduced shape: its base, its own variable values, the range terms, and the
  candidates (`base ∩ ranges`).

Each keeps its candidates together with the index's membership version at that time: any
insert or delete bumps the version, and a plan or base whose version is behind recomputes
before answering (score changes do not touch candidates: best-k reads the live score tiers
on every request). So a cached answer is never stale, and a fleet that changes between two
requests costs the second one its intersections, not its planning.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping

from pyroaring import BitMap

from policyc.compiler.bundle import Scalar

from .bloom import BloomKey
from .compiled_rule import CompiledRule, Ordering
from .result import AppliedRule
from .threshold_ranks import ThresholdRanks

PLAN_CACHE_SIZE = 16384
BASE_CACHE_SIZE = 2048
EFFECTIVE_BASES = 65536  # bases kept by what they answer (`FleetIndex.effective`): a bundle's reachable ones, prebuilt
EXACT_CACHE_SIZE = 4096
Term = Callable[[Mapping[str, Scalar]], BitMap]
Within = Callable[[Mapping[str, Scalar], BitMap], BitMap]  # a term already met with a few candidates


@dataclass(slots=True, eq=False)
class Base:
    """What every reduced shape with the same exact values shares; the mutable fields are
    its answer cache."""

    vars: Mapping[str, Scalar]  # the values its rules' requirements read, but the reduced ones (a private copy)
    rules: tuple[CompiledRule, ...]  # the rules that apply, in bundle order
    applied: tuple[AppliedRule, ...]
    exact: tuple[Term, ...]  # requirement bitmaps of the rules that read no range position
    ranged: tuple[tuple[Term, Within | None], ...]  # those of the rules that do (evaluated per `Plan`), each
    # with its restricted form when it has one (`CompiledRule.within`)
    clauses: tuple[frozenset[BloomKey], ...]  # Bloom keys every admitted instance carries
    ordering: Ordering | None = None  # the lone range term, when it is one ordering on the reduced variable
    version: int = -1  # index membership version of `bm`
    bm: BitMap | None = None  # the exact terms' intersection; None: the live set (no exact term)
    count: int = 0  # len(bm)
    bloom_version: int = -1  # filter version of `kept`
    kept: int = 0  # how many shards the filters cannot rule out (read when `clauses` is not empty)
    ranks: ThresholdRanks | None = None  # the best tier and count per threshold (`ordering` set)
    asked: tuple[int, int, int] | None = None  # versions at the last request answered without `ranks`


@dataclass(slots=True, eq=False)
class Plan:
    """The planned work for one reduced shape; the mutable fields are its answer cache."""

    vars: Mapping[str, Scalar]  # the first such request's own values (a private copy)
    base: Base
    applied: tuple[AppliedRule, ...]  # the base's (read on every match: kept here)
    epoch: int = 0  # the index's `keys_epoch` when made (`FleetIndex.plan` reuses it under that one only)
    version: int = -1  # index membership version of `cand`
    cand: BitMap | None = None  # may be the index's own bitmap: never mutate
    count: int = 0

    @property
    def rules(self) -> tuple[CompiledRule, ...]:
        return self.base.rules

    @property
    def clauses(self) -> tuple[frozenset[BloomKey], ...]:
        return self.base.clauses


class PlanCache:
    """A small LRU of plans (or bases) keyed by the reduced shape.

    Values that compare equal hash equal (`1.0` and `True`); the rules' comparisons treat
    such values identically too, so sharing a plan between them changes no answer. A key
    holding an unhashable value raises `TypeError` from `get`: the caller plans afresh."""

    __slots__ = ("size", "_plans", "hits", "misses")

    def __init__(self, size: int = PLAN_CACHE_SIZE) -> None:
        self.size = size
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()  # popping a plain dict's oldest repeatedly scans its dead slots
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any:
        plan = self._plans.get(key)
        if plan is None:
            self.misses += 1
            return None
        self._plans.move_to_end(key)  # most recently used last
        self.hits += 1
        return plan

    def put(self, key: Hashable, plan: Any) -> None:
        if self.size <= 0:
            return
        plans = self._plans
        if len(plans) >= self.size:
            plans.popitem(last=False)
        plans[key] = plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
