"""The bases a bundle's requests can produce, listed ahead of the requests.

A request's base (`plan.py`: the fixed values beside its latency target) costs 70-120 µs
the first time it is seen: rules, Bloom, intersections, threshold ranks. At fleet scale
most requests bring a target nobody sent before, but their fixed values come from small
declared domains: the names a header lists (`values:`), yes/no flags, the tenants'
classes, and for a name a requirement compares with `==` (`labels.family ==
request.family`), the values the fleet holds (any other selects nothing). So the bases
are enumerable, and `Registry` builds them off the serving path after its build
(`FleetIndex.prebuild`), keyed by what they answer (`FleetIndex.effective`).

The product of every domain is large (the realistic fleet's eight variables: ~124,000
combinations), but which rules apply depends only on which variables are present and on
the values the guards compare, and a base's bitmap only on those rules and the values
their requirements read. So the listing goes in two steps: every presence-and-guard-value
combination (a few hundred) gives its rules, and for each distinct set of rules only the
variables those requirements read are multiplied out (the realistic fleet: 128 rule sets,
36,720 bases).

A variable whose values cannot be listed (a quantity other than the latency target, a
name compared other than by `==` with no declared values, more than `DOMAIN_MOST` values)
is left absent; where it cannot be absent nothing is listed. At most `EFFECTIVE_BASES`
are listed (the bound of the cache they go to). Listing fewer bases than can occur is always safe: a base not
listed is made on its first request, as before.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policyc.compiler.bundle import And, Const, Expr, Not, Or, Scalar, Test
from policyc.compiler.semantics import atoms

from .plan import EFFECTIVE_BASES

if TYPE_CHECKING:
    from .index import FleetIndex
    from .ranking import ScoreTiers
    from .threshold_ranks import ThresholdRanks

GUARD_COMBINATIONS = 4096  # presence-and-guard-value combinations tried at most (more: nothing listed)
CHUNK = 8  # bases built per hold of the registry's lock (~0.7 ms at 100,000 instances), the GIL given up after each
DOMAIN_MOST = 1024  # a variable with more values than this (a host name) is left absent: listing it would crowd out the rest
_ABSENT = object()  # a variable left out of a combination
_PRESENT = object()  # a variable only present (its value read by no guard): stands in for any value


def _guard_tests(e: Expr | None, out: list[Test]) -> None:
    if isinstance(e, Test):
        out.append(e)
    elif isinstance(e, (And, Or)):
        for a in e.args:
            _guard_tests(a, out)
    elif isinstance(e, Not):
        _guard_tests(e.arg, out)


def domains(index: FleetIndex) -> dict[str, tuple[object, ...]] | None:
    """For each variable a rule reads (the reduced one aside), the values a request may give
    it, `_ABSENT` among them where it may be missing; None when some variable can be
    neither listed nor left out. Reads the index's postings: call it under the registry's
    lock."""
    bundle = index.bundle
    headers = {h.var: h for h in bundle.headers}
    classes = tuple(sorted({t.tenant_class for t in bundle.tenants}))
    eq_attrs: dict[str, set[str]] = {}  # variable -> attributes a requirement compares it with by ==
    other: set[str] = set()  # variables a requirement reads some other way
    for r in bundle.rules:
        for a in atoms(r.require):
            if a.operand.kind != "var":
                continue
            name = a.operand.name  # type: ignore[union-attr]
            if a.cmp == "==" and not index.attr_index[a.attr].ordered:
                eq_attrs.setdefault(name, set()).add(a.attr)
            else:
                other.add(name)
    guard_consts: dict[str, set[Scalar]] = {}
    guard_other: set[str] = set()  # compared in a guard other than by == with a constant
    for r in bundle.rules:
        tests: list[Test] = []
        _guard_tests(r.guard, tests)
        for t in tests:
            if t.cmp is None:
                continue
            if t.cmp == "==" and isinstance(t.operand, Const) and not isinstance(t.operand.value, tuple):
                guard_consts.setdefault(t.var, set()).add(t.operand.value)
            else:
                guard_other.add(t.var)
    out: dict[str, tuple[object, ...]] = {}
    for var in index._present_vars:
        if var in index.reducers:
            continue
        values: tuple[object, ...] | None
        if var == "tenant_class" and bundle.tenants:
            values = classes
            h = headers.get("tenant")
            absent = h is None or h.on_missing == "ignore" or (h.on_missing == "default" and h.default is None)
        else:
            h = headers.get(var)
            if h is None:  # read by a rule, set by no header: only a typed request carries it
                values, absent = (), True
            else:
                absent = h.on_missing == "ignore" or (h.on_missing == "default" and h.default is None)
                if h.type == "bool":
                    values = (True, False)
                elif h.type == "name" and h.values:
                    values = h.values
                elif h.type == "name" and var not in other and var not in guard_other:
                    held = set().union(*(index.attr_index[a].postings for a in eq_attrs.get(var, ())))
                    values = tuple(sorted(held | guard_consts.get(var, set()), key=str))
                else:
                    values = None
        if values is not None and len(values) > DOMAIN_MOST:
            values = None
        if values is None:
            if not absent:
                return None
            values = ()
        out[var] = values + ((_ABSENT,) if absent else ())
    return out


def reachable(index: FleetIndex, doms: dict[str, tuple[object, ...]], limit: int) -> Iterator[dict[str, Scalar]]:
    """Request variables for each base requests can produce (at most `limit`; those whose
    latency target the threshold ranks answer: the reduced variable present), one per
    distinct (rules, values their requirements read). Reads no postings (`domains` did)."""
    one = index._one_reducer
    if one is None:
        return
    target = 0.0  # any number: a base leaves the reduced variable out
    tested = set(index._tested_vars)
    names = list(doms)
    # step one: presence, and the guard-compared values, decide the rules
    choices = [doms[n] if n in tested else (_PRESENT, _ABSENT) if _ABSENT in doms[n] else (_PRESENT,) for n in names]
    total = 1
    for c in choices:
        total *= len(c)
    if total > GUARD_COMBINATIONS:
        return
    rule_sets: dict[tuple[str, ...], dict[str, object]] = {}
    for combo in itertools.product(*choices):
        v: dict[str, object] = {one[0]: target}
        for n, x in zip(names, combo):
            if x is not _ABSENT:
                v[n] = x
        ids = tuple(cr.rule.id for cr in index.rules if cr.applies(v))  # type: ignore[arg-type]
        rule_sets.setdefault(ids, v)
    # step two: the values each rule set's requirements read, multiplied out
    made = 0
    for v in rule_sets.values():
        reads = index._rule_shape(v)[6]  # type: ignore[arg-type]
        free = [n for n in reads if v.get(n) is _PRESENT]
        if any(n not in doms for n in free):
            continue
        lists = [[x for x in doms[n] if x is not _ABSENT] for n in free]
        for values in itertools.product(*lists):
            if made >= limit:
                return
            out = dict(v)
            out.update(zip(free, values))
            for n, x in list(out.items()):
                if x is _PRESENT:  # present, read by nothing: any value (no rule compares it)
                    out[n] = True
            made += 1
            yield out  # type: ignore[misc]


@dataclass(slots=True)
class Prebuilt:
    """What a registry's prebuild did (`Registry.prebuilt`)."""

    listed: int = 0  # bases listed (`reachable`)
    built: int = 0  # made or refreshed (the rest were cached and current)
    cpu_s: float = 0.0  # the prebuilding thread's CPU time
    wall_s: float = 0.0
    done: bool = False  # every listed base was visited (False: still going, or the index was replaced)


def prebuild(index: FleetIndex, tiers: ScoreTiers, lock: AbstractContextManager[object],
             current: Callable[[], bool], stats: Prebuilt, chunk: int = CHUNK) -> None:
    """Build every listed base of `index`, `chunk` at a time under the registry's `lock`
    (a reader waits for one chunk, under a millisecond, never for the whole), stopping as soon as
    `current()` says the index was replaced (a bundle swap). Bases the fleet's changes have
    made stale since are refreshed on their next request, as every base is."""
    t0, c0 = time.perf_counter(), time.thread_time()
    with lock:
        if not current():
            return
        doms = domains(index)
    listing = iter(()) if doms is None else reachable(index, doms, EFFECTIVE_BASES)
    same: dict[tuple, ThresholdRanks] = {}  # ranks by members, shared by bases that select alike
    while todo := list(itertools.islice(listing, chunk)):  # listed outside the lock, a chunk at a time
        stats.listed += len(todo)
        with lock:
            if not current():
                return
            for v in todo:
                if index.prebuild(v, tiers, same):
                    stats.built += 1
        stats.cpu_s, stats.wall_s = time.thread_time() - c0, time.perf_counter() - t0
        time.sleep(0)  # let a waiting reader in before the next chunk
    stats.cpu_s, stats.wall_s = time.thread_time() - c0, time.perf_counter() - t0
    stats.done = True
