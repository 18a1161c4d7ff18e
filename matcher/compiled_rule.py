"""A request rule as the index runs it: which request variables it reads, its guard as a
predicate, its requirement as bitmap algebra, its Bloom clauses.

Its own module because both the index, which compiles rules (`index.py`), and the
request-shape plans, which hold the rules that apply (`plan.py`), name it; neither imports
the other for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyroaring import BitMap

from policyc.compiler.bundle import RequestRule, Scalar
from policyc.compiler.meaning import Cmp

from .bloom import BloomKey
from .guards import Predicate
from .result import AppliedRule

Vars = Mapping[str, Scalar]
BitmapFn = Callable[[Vars], BitMap]
WithinFn = Callable[[Vars, BitMap], BitMap]
ClauseTemplate = tuple[tuple[str, Any], ...]  # alternatives (attr, const value | index._VarRef)


@dataclass(frozen=True, slots=True)
class Ordering:
    """A requirement that is one ordering of a range attribute against a request variable
    (`slo_latency <= request.slo`): what `threshold_ranks.py` answers without a bitmap."""

    attr: str
    cmp: Cmp  # one of <, <=, >, >=
    var: str


@dataclass(frozen=True, slots=True)
class CompiledRule:
    rule: RequestRule
    applied: AppliedRule
    reads: frozenset[str]
    applies: Predicate  # every read present and the guard holds (`semantics.rule_applies`)
    require: BitmapFn
    const_clauses: tuple[frozenset[BloomKey], ...]  # Bloom clauses fixed by the bundle
    var_clauses: tuple[ClauseTemplate, ...]  # Bloom clauses that read request values
    static: bool  # the requirement reads no request variable: kept materialised
    # the requirement met with a few candidates (`within & require(v)`) without building the
    # requirement's own bitmap; set for a lone ordering against a request variable
    within: WithinFn | None = None
    ordering: Ordering | None = None  # the requirement, when it is one ordering (`within` is then set)
