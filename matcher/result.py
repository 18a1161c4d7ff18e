"""What the matcher answers: match results and explanations (plain frozen data).

These are what the decision service turns into API messages and audit records, so every
rule carries its `origin` (`file:line:col`) and counts are over the live fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pyroaring import FrozenBitMap

from policyc.compiler.bundle import SourceRef

from .instance import Instance


@dataclass(frozen=True, slots=True)
class AppliedRule:
    id: str
    origin: SourceRef


@dataclass(frozen=True, slots=True)
class Scored:
    instance: Instance
    score: float


Form = Literal["bitmap", "slots", "ids", "id_set", "instances"]
FORMS: tuple[Form, ...] = ("bitmap", "slots", "ids", "id_set", "instances")


@dataclass(slots=True)
class AllMatches:
    """Every instance that satisfies every applicable rule (`Registry.matches`), in the
    form asked for (`form`); only that field is set. In no particular order (the index's
    slot order: ranking them is what `match` is for); `rules` are the rules that applied.

    - `bitmap`: the candidate slots (a frozen copy of the index's bitmap)
    - `slots`: the same as a numpy uint32 array, ascending
    - `ids`: their ids, a numpy object array of `str` in slot order
    - `id_set`: their ids as a set
    - `instances`: instance objects (the slow form: most are made on the spot)
    """

    count: int
    rules: tuple[AppliedRule, ...]
    bundle_hash: str
    form: Form = "instances"
    bitmap: FrozenBitMap | None = None
    slots: np.ndarray | None = None
    ids: np.ndarray | None = None
    id_set: set[str] | None = None
    instances: tuple[Instance, ...] | None = None


@dataclass(frozen=True, slots=True)
class MatchResult:
    """`count` instances satisfy every applicable rule; `best` holds up to k of them, best
    score first (ties by (model, host, GPU), then instance id); `rules` are the rules that
    applied."""

    count: int
    best: tuple[Scored, ...]
    rules: tuple[AppliedRule, ...]
    bundle_hash: str

    @property
    def admitted(self) -> bool:
        return self.count > 0


@dataclass(frozen=True, slots=True)
class PredicateCount:
    """One atom of a rule's requirement and how many live instances fail it on its own."""

    predicate: str  # rendered, e.g. `region == eu-west`
    origin: SourceRef
    failing: int


@dataclass(frozen=True, slots=True)
class RuleExplanation:
    id: str
    origin: SourceRef
    applied: bool
    why: str  # "applies", or why it does not (guard false, absent request variable)
    eliminated: int  # live instances the rule's requirement excludes on its own
    eliminated_in_order: int  # of those still left after the earlier applied rules
    predicates: tuple[PredicateCount, ...]


@dataclass(frozen=True, slots=True)
class Explanation:
    live: int
    count: int
    rules: tuple[RuleExplanation, ...]
    shards: int
    shards_skipped_by_bloom: int

    def blocking(self) -> tuple[str, ...]:
        """The applied rules that eliminate instances; when nothing matches, those whose
        removal alone would admit some instance come first (see `policy_tests.py`)."""
        return tuple(r.id for r in self.rules if r.applied and r.eliminated > 0)
