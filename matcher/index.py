"""The fleet index for one bundle: postings per attribute, shard Bloom filters, and the
request rules compiled to bitmap algebra over them.

Following the bundle's index plan: equality / set / boolean attributes get inverted
postings (and feed the shard Bloom filters); range attributes also keep their sorted
distinct values. A request is answered in two steps, Bloom first and index second: the
keys every admitted instance must carry (a conjunction of any-of clauses drawn from the
applicable requirements) are probed in the sliced Bloom filters, which may rule out whole
shards (or everything: an empty answer without touching the postings); then each applicable
rule's requirement is evaluated as bitmap algebra (`And` ∩, `Or` ∪, `Not` and `!=`
complement against the live set) and the results are intersected, smallest first.

Everything that depends only on the request (which rules apply, their Bloom keys, the
requirement closures bound to the request's values) is a `Plan` (`plan.py`), cached per
typed request; the candidates a plan computed stay valid until the next insert or delete
(`version`).

The best candidate alone (`best_one`, k = 1) of a request whose latency target is read by
one ordering only (`slo_latency <= request.slo`) needs neither: its base (the fixed values'
intersection, shared by every target) keeps threshold ranks (`threshold_ranks.py`), so a
target never seen before costs one bisection and a look at one score tier. The bases
themselves are built ahead of their requests (`prebuild`, listed by `base_catalog.py`).

Not thread-safe by itself: `Registry` serialises writers and readers around it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from pyroaring import BitMap

from policyc.compiler.attributes import BODY_REQUEST_VARS
from policyc.compiler.bundle import Atom, Bundle, Expr, RequestRule, Scalar

from .attribute_index import EMPTY, AttributeIndex, union
from .bloom import SHARD_SIZE, BloomKey, ShardBloom
from policyc.compiler.meaning import Cmp
from policyc.compiler.semantics import atoms, value_reads
from .compiled_rule import BitmapFn, ClauseTemplate, CompiledRule, Ordering, Vars, WithinFn
from .guards import compile_applies
from .instance_predicates import compile_static
from .plan import BASE_CACHE_SIZE, EFFECTIVE_BASES, EXACT_CACHE_SIZE, PLAN_CACHE_SIZE, Base, Plan, PlanCache
from .ranking import ScoreTiers
from .result import AppliedRule
from .row_check import Row, RowCheck, RowFacts, RowFn
from .slot_attrs import SlotAttrs
from .threshold_ranks import BELOW, ThresholdRanks, best_at

BLOOM_KINDS = ("equality", "set", "boolean")
# attributes a deployment shares with its rollout (few values each): the shard group, if
# the rules index them (`shard_group`)
SHARD_GROUP_ATTRS = ("model", "version", "region", "gpu_arch", "gpu_model", "session_state")
ORDERINGS = (Cmp.LT, Cmp.LE, Cmp.GT, Cmp.GE)
SMALL_BASE = 4096  # a base this small is intersected with a range term without counting the term first
RULE_SHAPES = 1024  # rule shapes kept (`FleetIndex._rule_shape`)
BOUND_CLAUSES = 65536  # Bloom clauses bound to request values kept for sharing (`FleetIndex._clauses`)
_ABSENT = object()  # a guard-tested variable the request lacks (in a rule shape's key)
# (rules, their AppliedRules, exact terms, ranged terms, the lone ordering, the rules' ids,
# the variables their requirements read but the reduced ones): what `_make_base` shares
# between bases of one rule shape
_RuleShape = tuple[tuple[CompiledRule, ...], tuple[AppliedRule, ...], tuple[BitmapFn, ...],
                   tuple[tuple[BitmapFn, WithinFn | None], ...], Ordering | None, tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class _VarRef:
    name: str


@dataclass(slots=True)
class RankStats:
    """How `best_one` answered (for benchmarks and tests)."""

    by_ranks: int = 0  # from a base's threshold ranks
    by_bitmap: int = 0  # from the base's bitmap (the first request since the ranks went stale)
    builds: int = 0  # threshold ranks built


@dataclass(slots=True)
class BloomStats:
    """Counted per candidate computation (a plan's first request, or its first after the
    fleet changed), not per request: cached answers probe nothing."""

    requests: int = 0  # computations that had keys to probe
    shards_probed: int = 0
    shards_skipped: int = 0
    emptied: int = 0  # computations answered empty by the filters alone


def _guard_tested(e: Expr | None) -> set[str]:
    """Request variables a guard compares with a value (not only `has()`)."""
    if e is None:
        return set()
    if e.op == "test":
        return {e.var} if e.cmp is not None else set()  # type: ignore[union-attr]
    if e.op in ("and", "or"):
        return set().union(*(_guard_tested(a) for a in e.args))  # type: ignore[union-attr]
    if e.op == "not":
        return _guard_tested(e.arg)  # type: ignore[union-attr]
    return set()


def render(a: Atom) -> str:
    right = f"request.{a.operand.name}" if a.operand.kind == "var" else a.operand.value  # type: ignore[union-attr]
    if isinstance(right, bool):
        right = "yes" if right else "no"
    elif isinstance(right, tuple):
        right = "[" + ", ".join(str(v) for v in right) + "]"
    return f"{a.attr} {a.cmp.replace('_', ' ')} {right}"


class FleetIndex:
    def __init__(self, bundle: Bundle, shard_size: int = SHARD_SIZE, plan_cache: int = PLAN_CACHE_SIZE) -> None:
        self.bundle = bundle
        self.shard_size = shard_size
        kinds: dict[str, str] = {ia.attr: ia.kind for ia in bundle.index_plan}
        for rule in bundle.rules:  # the plan covers every atom; be safe if a bundle's does not
            for a in atoms(rule.require):
                kinds.setdefault(a.attr, "range" if a.cmp in ORDERINGS else "equality")
        self.attr_index = {a: AttributeIndex(a, ordered=(k == "range")) for a, k in sorted(kinds.items())}
        self.bloom_attrs = tuple(a for a, k in sorted(kinds.items()) if k in BLOOM_KINDS)
        self.range_attrs = tuple(a for a, idx in self.attr_index.items() if idx.ordered)
        contract_labels = {"labels." + k for c in bundle.contracts for k, _ in c.labels}
        self.group_attrs = tuple(a for a, k in sorted(kinds.items()) if k in ("equality", "set")
                                 and (a in SHARD_GROUP_ATTRS or a in contract_labels))
        self.bloom = ShardBloom()
        self.live = BitMap()
        self.attrs = SlotAttrs()  # slot -> attribute view (`slot_attrs.py`)
        self.stats = BloomStats()
        self.rules = tuple(self._compile_rule(r) for r in bundle.rules)
        # requirements that read no request variable are maintained as bitmaps on every
        # insert/delete (`instance_predicates.py`: the reference semantics, compiled), so a
        # request pays one intersection for them instead of their whole algebra
        self.static: dict[str, BitMap] = {cr.rule.id: BitMap() for cr in self.rules if cr.static}
        self._static_rules = [(compile_static(cr.rule.require), self.static[cr.rule.id]) for cr in self.rules if cr.static]
        # slot -> (attributes, mask of the static requirements met), and request shape -> the
        # applying rules compiled for one row (`row_admits`, `row_check.py`)
        self._static_bit = {cr.rule.id: i for i, cr in enumerate(cr for cr in self.rules if cr.static)}
        # a row carries the values of the attributes a requirement compares with a request variable
        # (what the compiled checks read by position); the others are read off its attributes
        self.rows = RowFacts([holds for holds, _ in self._static_rules],
                             sorted({a.attr for cr in self.rules if not cr.static for a in atoms(cr.rule.require)
                                     if a.operand.kind == "var"}))
        self._row_checks: dict[tuple[str, ...], tuple[Callable[[Vars], Any] | None, dict[Any, RowFn]]] = {}
        self.version = 0  # bumped by every insert / delete: cached candidates are older
        self.rank_misses = 0  # threshold ranks that named a tier without the best candidate (never expected)
        self.rank_stats = RankStats()
        self.plans = PlanCache(min(plan_cache, EXACT_CACHE_SIZE))  # typed request -> Plan (a repeated request's fast path)
        self.reduced = PlanCache(plan_cache)  # reduced shape -> Plan
        self.bases = PlanCache(min(plan_cache, BASE_CACHE_SIZE))  # reduced shape less range positions -> Base
        self.reducers = self._reducers()  # request variable -> the range attribute it is placed among
        self._reducer_items = tuple(sorted(self.reducers.items()))
        # the one reduced variable and its attribute, when there is exactly one (`best_one`)
        self._one_reducer = self._reducer_items[0] if len(self._reducer_items) == 1 else None
        red = self.reducers.keys()
        self._ranged = tuple((cr, not red.isdisjoint(cr.reads)) for cr in self.rules)  # reads a reduced variable?
        # request variables a parsed request carries (its headers' variables, the tenant's
        # class) that no rule reads, in guard or requirement: they change no answer, so the
        # shape and base keys leave them out (`_read_vars`), and every tenant of a class
        # shares one base instead of making its own
        read = frozenset().union(*(cr.reads for cr in self.rules))
        carried = {h.var for h in bundle.headers} | ({"tenant_class"} if bundle.tenants else set()) | set(BODY_REQUEST_VARS)
        self._unread = tuple(sorted(carried - read))
        # which rules apply depends on which read variables are present and on the values the
        # guards compare, nothing else: a new base looks its rules up by those (`_rule_shape`)
        self._present_vars = tuple(sorted(read))
        self._tested_vars = tuple(sorted(set().union(*(_guard_tested(r.guard) for r in bundle.rules))))
        self._shapes = PlanCache(RULE_SHAPES)  # rule shape -> _RuleShape, least recently used out first
        self._bound: dict[tuple[BloomKey, ...], frozenset[BloomKey]] = {}  # a clause's alternatives -> the clause (`_clauses`)
        # (the rules that apply, the values their requirements read) -> Base: what a base's
        # answer depends on, so requests that differ elsewhere (a flag sent as `no` or not
        # sent, another tenant of a class) share one, and `prebuild` fills it ahead of them
        self.effective = PlanCache(EFFECTIVE_BASES if plan_cache > 0 else 0)

    # ------------------------------------------------------------------ updates
    def shard_group(self, attrs: Mapping[str, Scalar]) -> tuple:
        """Which slot shards an instance's slot comes from (`slots.py`): instances that agree
        on every indexed equality attribute of their rollout (model, region, architecture,
        a contract label, ...) share shards, so the Bloom filters can skip the shards of
        other values and each postings bitmap is a few long runs. Attributes no rule reads
        do not split the fleet (a fleet with a contract per SLO would otherwise get a
        nearly empty shard per contract and region)."""
        return tuple([attrs.get(a) for a in self.group_attrs])

    def _bloom_keys(self, attrs: Mapping[str, Scalar]) -> list[BloomKey]:
        return [(a, attrs[a]) for a in self.bloom_attrs if a in attrs]

    def insert(self, slot: int, attrs: Mapping[str, Scalar]) -> None:
        get = attrs.get
        for a, idx in self.attr_index.items():
            v = get(a)
            if v is not None:
                bm = idx.postings.get(v)
                if bm is None or idx.ordered:
                    idx.add(slot, v)
                else:  # the common case, inlined: an existing posting of an unordered attribute
                    bm.add(slot)
        self.bloom.add(slot // self.shard_size, self._bloom_keys(attrs))
        for holds, bm in self._static_rules:
            if holds(attrs):
                bm.add(slot)
        self.attrs[slot] = attrs
        self.rows.put(slot, attrs)
        self.live.add(slot)
        self.version += 1

    def delete(self, slot: int) -> None:
        attrs = self.attrs.pop(slot)
        self.rows.drop(slot)
        self.live.discard(slot)
        self.version += 1
        get = attrs.get
        for a, idx in self.attr_index.items():
            v = get(a)
            if v is not None:
                idx.remove(slot, v)
        self.bloom.remove(slot // self.shard_size, self._bloom_keys(attrs))
        for _, bm in self._static_rules:
            bm.discard(slot)

    def bulk(self, items: list[tuple[int, Mapping[str, Scalar]]]) -> None:
        """Fill an empty index at once: each postings bitmap is built once from a list."""
        if self.attrs:
            raise ValueError("bulk() fills an empty index")
        # instances of one rollout share their attribute values: group slots by the tuple
        # of indexed values and do the per-attribute work once per distinct tuple
        names = tuple(self.attr_index)
        groups: dict[tuple, list[int]] = {}
        sample: dict[tuple, Mapping[str, Scalar]] = {}
        for slot, attrs in items:
            sig = tuple(map(attrs.get, names))
            g = groups.get(sig)
            if g is None:
                g = groups[sig] = []
                sample[sig] = attrs
            g.append(slot)
        self._bulk_groups(groups, sample)
        self.attrs.own = dict(items)
        self.live = BitMap(sorted(self.attrs.own))
        self.version += 1

    def bulk_rows(self, rows: list[tuple[Mapping[str, Scalar], np.ndarray]], view: Callable[[int], Mapping[str, Scalar]]) -> None:
        """Fill an empty index from rows that share attributes: (one member's attributes,
        the slots of every instance whose indexed attributes equal them). Nothing is kept
        per instance: `view(slot)` rebuilds an instance's attributes when asked
        (`slot_attrs.py`); a check of one row (`row_admits`) reads its group's attributes.
        The rows must agree on every attribute the rules read."""
        if self.attrs:
            raise ValueError("bulk_rows() fills an empty index")
        names = tuple(self.attr_index)
        groups: dict[tuple, list[int]] = {}
        sample: dict[tuple, Mapping[str, Scalar]] = {}
        for attrs, slots in rows:
            sig = tuple(map(attrs.get, names))
            g = groups.get(sig)
            if g is None:
                g = groups[sig] = []
                sample[sig] = attrs
            g.extend(slots.tolist())
        self._bulk_groups(groups, sample)
        everyone = BitMap(np.sort(np.concatenate([s for _, s in rows])).tolist()) if rows else BitMap()
        self.attrs.set_rows(everyone, view)
        self.live = everyone.copy()
        self.version += 1

    def _bulk_groups(self, groups: dict[tuple, list[int]], sample: dict[tuple, Mapping[str, Scalar]]) -> None:
        names = tuple(self.attr_index)
        for i, a in enumerate(names):
            self.attr_index[a].bulk_groups((sig[i], slots) for sig, slots in groups.items() if sig[i] is not None)
        size = self.shard_size
        static: list[list[int]] = [[] for _ in self._static_rules]
        rows = []  # each group's row (`row_check.py`): its static requirements' mask from the same verdicts
        for sig, slots in groups.items():
            attrs = sample[sig]
            keys = self._bloom_keys(attrs)
            per_shard = Counter([s // size for s in slots])
            for shard, n in per_shard.items():
                self.bloom.add(shard, keys, n)
            mask = 0
            for i, ((holds, _), into) in enumerate(zip(self._static_rules, static)):
                if holds(attrs):
                    into.extend(slots)
                    mask |= 1 << i
            rows.append((self.rows.row(attrs, mask), slots))
        for (_, bm), slots in zip(self._static_rules, static):
            bm.update(sorted(slots))
        self.rows.fill(rows)

    # ------------------------------------------------------------------ compiling rules
    def _compile_rule(self, rule: RequestRule) -> CompiledRule:
        clauses = tuple(self._necessary(rule.require))
        static = not value_reads(rule.require)
        require = self._compile(rule.require)
        ordering = None if static else self._ordering(rule.require)
        if static:
            rid = rule.id

            def require(v: Vars) -> BitMap:
                return self.static[rid]
        return CompiledRule(
            rule=rule, applied=AppliedRule(rule.id, rule.origin),
            reads=frozenset(value_reads(rule.guard) | value_reads(rule.require)),
            applies=compile_applies(rule), require=require,
            const_clauses=tuple(frozenset(c) for c in clauses if not any(isinstance(v, _VarRef) for _, v in c)),
            var_clauses=tuple(c for c in clauses if any(isinstance(v, _VarRef) for _, v in c)),
            static=static, within=self._within(ordering), ordering=ordering,
        )

    def _ordering(self, e: Expr) -> Ordering | None:
        """The requirement as one ordering of a range attribute against a request variable
        (`slo_latency <= request.slo`), else None."""
        if e.op != "atom":
            return None
        a: Atom = e  # type: ignore[assignment]
        if a.cmp not in ORDERINGS or a.operand.kind != "var" or not self.attr_index[a.attr].ordered:
            return None
        return Ordering(a.attr, a.cmp, a.operand.name)  # type: ignore[union-attr]

    def _within(self, o: Ordering | None) -> WithinFn | None:
        """The restricted form of a lone ordering: met with a few candidates directly."""
        if o is None:
            return None
        name, cmp, order_within = o.var, o.cmp, self.attr_index[o.attr].order_within
        return lambda v, within: order_within(cmp, v[name], within)  # type: ignore[arg-type]

    def _compile(self, e: Expr) -> BitmapFn:
        if e.op == "atom":
            return self._compile_atom(e)  # type: ignore[arg-type]
        if e.op == "and":
            fns = [self._compile(a) for a in e.args]  # type: ignore[union-attr]

            def conj(v: Vars) -> BitMap:
                out = fns[0](v)
                for f in fns[1:]:
                    if not out:
                        return out
                    out = out & f(v)
                return out
            return conj
        if e.op == "or":
            fns = [self._compile(a) for a in e.args]  # type: ignore[union-attr]
            return lambda v: union([f(v) for f in fns])
        if e.op == "not":
            inner = self._compile(e.arg)  # type: ignore[union-attr]
            return lambda v: self._complement(inner(v))
        raise ValueError(f"a request test inside a requirement: {e}")

    def _complement(self, bm: BitMap) -> BitMap:
        """Live instances not in `bm`; the live set itself (shared) when `bm` is empty."""
        return self.live - bm if bm else self.live

    def _compile_atom(self, a: Atom) -> BitmapFn:
        idx, cmp = self.attr_index[a.attr], a.cmp
        if cmp == "==":
            op: Callable[[Any], BitMap] = idx.eq
        elif cmp == "!=":
            def op(x: Any) -> BitMap:
                return self._complement(idx.eq(x))
        elif cmp == "in":
            op = idx.any_of
        elif cmp == "not_in":
            def op(x: Any) -> BitMap:
                return self._complement(idx.any_of(x))
        else:
            def op(x: Any) -> BitMap:
                return idx.order(cmp, x)
        if a.operand.kind == "var":
            name = a.operand.name  # type: ignore[union-attr]
            return lambda v: op(v[name])
        const = a.operand.value  # type: ignore[union-attr]
        return lambda v: op(const)

    def _necessary(self, e: Expr) -> list[ClauseTemplate]:
        """Key clauses every instance satisfying `e` must meet (used only to skip shards,
        so leaving a condition out is always safe)."""
        if e.op == "atom":
            a: Atom = e  # type: ignore[assignment]
            if a.attr not in self.bloom_attrs:
                return []
            if a.cmp == "==":
                val = _VarRef(a.operand.name) if a.operand.kind == "var" else a.operand.value  # type: ignore[union-attr]
                return [((a.attr, val),)]
            if a.cmp == "in" and a.operand.kind == "const":
                return [tuple((a.attr, v) for v in a.operand.value)]  # type: ignore[union-attr]
            return []
        if e.op == "and":
            return [c for arg in e.args for c in self._necessary(arg)]  # type: ignore[union-attr]
        if e.op == "or":
            firsts = []
            for arg in e.args:  # type: ignore[union-attr]
                cs = self._necessary(arg)
                if not cs:
                    return []
                firsts.append(cs[0])
            return [tuple(alt for c in firsts for alt in c)]
        return []

    # ------------------------------------------------------------------ answering
    def applicable(self, vars: Vars) -> list[CompiledRule]:
        return [cr for cr in self.rules if cr.applies(vars)]

    def shard_survivors(self, rules: Iterable[CompiledRule], vars: Vars) -> BitMap | None:
        """Shards the Bloom filters cannot rule out, or None when no rule gives keys."""
        clauses = self._clauses(rules, vars)
        return self.bloom.surviving(list(clauses)) if clauses else None

    def _clauses(self, rules: Iterable[CompiledRule], vars: Vars) -> tuple[frozenset[BloomKey], ...]:
        """The Bloom clauses of `rules` bound to `vars`; a clause bound to the same values
        as an earlier one is that one (`_bound`: tens of thousands of prebuilt bases share a
        few hundred clauses)."""
        out: list[frozenset[BloomKey]] = []
        bound = self._bound
        for cr in rules:
            out.extend(cr.const_clauses)
            for tmpl in cr.var_clauses:
                alts = tuple([(attr, vars[v.name] if type(v) is _VarRef else v) for attr, v in tmpl])
                clause = bound.get(alts)
                if clause is None:
                    if len(bound) >= BOUND_CLAUSES:
                        bound.clear()  # values no fleet holds, sent many times over: start again
                    clause = bound[alts] = frozenset(alts)
                out.append(clause)
        return tuple(out)

    # ------------------------------------------------------------------ shapes
    def _reducers(self) -> dict[str, AttributeIndex]:
        """Request variables that matter only through their place among one range
        attribute's values: compared (`<`, `<=`, `>`, `>=`) with that one attribute and
        nothing else, and read by guards only through `has()`."""
        uses: dict[str, set[str]] = {}
        exact: set[str] = set()
        for r in self.bundle.rules:
            exact.update(_guard_tested(r.guard))
            for a in atoms(r.require):
                if a.operand.kind != "var":
                    continue
                name = a.operand.name  # type: ignore[union-attr]
                if a.cmp in ORDERINGS and self.attr_index[a.attr].ordered:
                    uses.setdefault(name, set()).add(a.attr)
                else:
                    exact.add(name)
        return {v: self.attr_index[next(iter(attrs))] for v, attrs in uses.items() if v not in exact and len(attrs) == 1}

    def shape_key(self, vars: Vars) -> tuple[tuple, tuple]:
        """(the reduced shape, the reduced shape without range positions): both are (the
        other variables' items, those no rule reads left out (`_read_vars`), ...) with, for
        the reduced shape, each reduced variable as (name, value-set version, position)
        and, for the base key, its name only. Equal
        keys give equal answers: every rule reads a reduced variable through orderings
        against its attribute's values alone. A reduced variable holding a non-number
        stays among the exact items. Raises TypeError for an unhashable value."""
        exact = self._read_vars(vars)
        reduced: list[tuple[str, int, int]] = []
        names: list[str] = []
        for name, idx in self._reducer_items:
            x = exact.get(name)
            if type(x) is float or type(x) is int:
                del exact[name]
                reduced.append((name, idx.keys_version, idx.position(x)))  # type: ignore[arg-type]
                names.append(name)
        items = tuple(exact.items())
        key = (items, tuple(reduced))
        hash(key)
        return key, (items, tuple(names))

    def _read_vars(self, vars: Vars) -> dict[str, Scalar]:
        """A copy of `vars` without the variables a parsed request carries that no rule
        reads (a typed request's own extra ones stay: a key holding them only shares less)."""
        exact = dict(vars)
        for u in self._unread:
            if u in exact:
                del exact[u]
        return exact

    def _read_items(self, vars: Vars) -> tuple:
        """The shape key of a bundle without reduced variables: the read variables' items;
        raises TypeError for an unhashable value."""
        items = tuple(self._read_vars(vars).items())
        hash(items)
        return items

    def best_one(self, vars: Vars, tiers: ScoreTiers,
                 base: Base | None = None) -> tuple[int, int | None, tuple[AppliedRule, ...], Base] | None:
        """(how many match, the best slot or None, the rules that applied, the base) for a
        request whose only rule reading its reduced variable is one ordering (`slo_latency
        <= request.slo`), from its base's threshold ranks (`threshold_ranks.py`): no plan,
        no candidate bitmap, nothing cached per target value. None when the request is not
        of that form (the caller plans it). `base`: the request's base, when the caller
        kept it from an earlier answer to the same request."""
        one = self._one_reducer
        if one is None:
            return None
        name, attr = one
        x = vars.get(name)
        if type(x) is not float and type(x) is not int:
            return None
        if base is None:
            exact = self._read_vars(vars)
            del exact[name]
            bkey = (tuple(exact.items()), (name,))
            try:
                base = self.bases.get(bkey)
            except TypeError:  # an unhashable value (only through `Request.of`)
                return None
            if base is None:
                base = self._make_base(vars)
                self.bases.put(bkey, base)
        o = base.ordering
        if o is None:
            return None
        if base.version != self.version:
            self._refresh_base(base)
        if not base.count:
            return 0, None, base.applied, base
        ranks = base.ranks
        if ranks is None or not ranks.current(self.version, attr, tiers):
            asked = (self.version, attr.keys_version, tiers.rank_version)
            if (ranks is not None or base.count > SMALL_BASE) and base.asked != asked:
                # the first request since the ranks went stale (or to a large new base): a fleet
                # changing between every two requests never pays a build per request
                base.asked = asked
                self.rank_stats.by_bitmap += 1
                count, slot = self._best_direct(base, o, x, tiers)  # type: ignore[arg-type]
                return count, slot, base.applied, base
            members = self.live if base.bm is None else base.bm
            compact = ranks is not None and ranks.counts is None  # a prebuilt base keeps its compact form
            ranks = base.ranks = ThresholdRanks(members, attr, o.cmp in BELOW, tiers, self.version, compact)
            self.rank_stats.builds += 1
        self.rank_stats.by_ranks += 1
        count, slot = best_at(ranks, attr, o.cmp, x, tiers)  # type: ignore[arg-type]
        if count and slot is None:
            self.rank_misses += 1
            count, slot = self._best_direct(base, o, x, tiers)  # type: ignore[arg-type]
        return count, slot, base.applied, base

    def _best_direct(self, base: Base, o: Ordering, x: float, tiers: ScoreTiers) -> tuple[int, int | None]:
        """`best_one` from the base's bitmap: the ordering met with it, best-k on the result."""
        attr = self.attr_index[o.attr]
        members = base.bm
        if members is not None and base.count <= SMALL_BASE:
            cand = attr.order_within(o.cmp, x, members)
        else:
            bm = attr.order(o.cmp, x)
            if members is None:
                cand = bm
            elif len(bm) == len(self.live):  # every live instance meets it: the base as it is
                cand = members
            else:
                cand = members & bm
        n = len(cand)
        found = tiers.best(cand, n, 1)
        return n, found[0] if found else None

    def plan(self, vars: Vars, raw: tuple | None = None) -> Plan:
        """The plan for this typed request, with candidates current for the live fleet:
        first by its exact values (`plans`: a repeated request pays one dict look-up), then
        by its reduced shape (`reduced`, then `bases`). `raw`: `tuple(vars.items())`, when
        the caller has it.

        A plan found by exact values may have been made for another request of the same
        reduced shape (another target between the same two values); once the values
        themselves change (`keys_epoch`), that request may lie on the other side of a new
        value, so such a plan is only reused under the epoch it was made in."""
        if raw is None:
            raw = tuple(vars.items())
        epoch = self.keys_epoch()
        try:
            plan = self.plans.get(raw)
        except TypeError:  # an unhashable value (only through `Request.of`): not cached
            plan, raw = None, None
        if plan is None or plan.epoch != epoch:
            plan = self._reduced_plan(vars, raw is not None, epoch)
            if raw is not None:
                self.plans.put(raw, plan)
        if plan.version != self.version:
            self._refresh(plan)
        return plan

    def keys_epoch(self) -> int:
        """Changes whenever a reduced variable's attribute gains or loses a distinct value
        (each `keys_version` only grows, so their sum does too)."""
        items = self._reducer_items
        if len(items) == 1:
            return items[0][1].keys_version
        return sum(idx.keys_version for _, idx in items)

    def _reduced_plan(self, vars: Vars, hashable: bool, epoch: int) -> Plan:
        key: tuple | None = None
        bkey: tuple | None = None
        if hashable:
            key, bkey = self.shape_key(vars) if self.reducers else ((k := self._read_items(vars)), k)
            plan = self.reduced.get(key)
            if plan is not None:
                return plan
        base = self.bases.get(bkey) if key is not None else None
        if base is None:
            base = self._make_base(vars)
            if key is not None:
                self.bases.put(bkey, base)
        plan = Plan(dict(vars), base, base.applied, epoch)
        if key is not None:
            self.reduced.put(key, plan)
        return plan

    def _make_base(self, vars: Vars) -> Base:
        """The base of requests like `vars`: its rules from the memo of rule shapes (a fleet's
        requests have a few dozen: which headers, which flags), then the base of those rules
        and the values their requirements read (`effective`), made when there is none, its
        Bloom clauses bound to those values."""
        try:
            key = (tuple([n in vars for n in self._present_vars]),
                   tuple([vars.get(n, _ABSENT) for n in self._tested_vars]))
            shape = self._shapes.get(key)
        except TypeError:  # an unhashable value (only through `Request.of`): worked out afresh
            key, shape = None, None
        if shape is None:
            shape = self._rule_shape(vars)
            if key is not None:
                self._shapes.put(key, shape)
        rules, applied, exact, ranged, ordering, ids, reads = shape
        own = {n: vars[n] for n in reads}  # all a base reads (a private copy)
        ekey = None
        if key is not None:
            try:
                ekey = (ids, tuple(own.values()))
                base = self.effective.get(ekey)
            except TypeError:  # an unhashable value (only through `Request.of`)
                ekey = base = None
            if base is not None:
                return base  # type: ignore[no-any-return]
        base = Base(own, rules, applied, exact, ranged, self._clauses(rules, own), ordering)
        if ekey is not None:
            self.effective.put(ekey, base)
        return base

    def prebuild(self, vars: Vars, tiers: ScoreTiers, same: dict[tuple, ThresholdRanks] | None = None) -> bool:
        """Make the base of requests like `vars` (its bitmap, and its threshold ranks when it
        has members and a lone ordering) ahead of them (`base_catalog.py`), unless a current
        one is cached; True when something was built. Counts no request statistic. The
        ranks are compact (`ThresholdRanks._compact`): a bundle's reachable bases are tens
        of thousands, most with a few dozen members. `same`: ranks built so far in this
        pass by their attribute, direction and members' content; a base with the same members (the finance tenant's
        hardening rule and the three flags it implies select alike) shares them and their
        bitmap, neither of which is ever changed in place."""
        base = self._make_base(vars)
        attr = None if base.ordering is None else self.attr_index[base.ordering.attr]
        if base.version == self.version and (not base.count or attr is None or (
                base.ranks is not None and base.ranks.current(self.version, attr, tiers))):
            return False
        if base.version != self.version:
            self._refresh_base(base, counted=False)
        if base.count and attr is not None:
            o = base.ordering
            below = o.cmp in BELOW  # type: ignore[union-attr]
            # the ranks are made of the members, the attribute ordered and the direction: all three key them
            key = None if same is None or base.bm is None else (o.attr, below, base.count, base.bm.serialize())  # type: ignore[union-attr]
            ranks = None if key is None else same.get(key)  # type: ignore[union-attr]
            if ranks is not None and ranks.current(self.version, attr, tiers):
                base.bm, base.ranks = ranks.members, ranks
                return True
            members = self.live if base.bm is None else base.bm
            base.ranks = ThresholdRanks(members, attr, below, tiers, self.version, compact=True)
            if key is not None:
                same[key] = base.ranks  # type: ignore[index]
        return True

    def row_admits(self, slot: int, vars: Vars) -> bool:
        """Whether the live instance at `slot` meets every rule that applies to `vars`, read
        off its own row (`row_check.py`); `Registry.admits` reads the row by id and calls
        `check_for` itself."""
        rows = self.rows.rows
        row = rows[slot] if slot < len(rows) else None
        return row is not None and self.admits_row(row, vars)

    def admits_row(self, row: Row, vars: Vars) -> bool:
        """`check_for(vars)(row, vars)` in one frame (the check by id's hot path: a Python
        call less)."""
        entry = self._row_checks.get(tuple(vars))
        if entry is not None:
            tested, checks = entry
            try:
                check = checks.get(tested(vars) if tested is not None else None)
            except TypeError:  # an unhashable value (only through `Request.of`)
                check = None
            if check is not None:
                return check(row, vars)
        return self.check_for(vars)(row, vars)

    def check_for(self, vars: Vars) -> RowFn:
        """The compiled check of one row (`row_check.py`) for requests like `vars`: the
        static requirements by one mask test, the others on the row's attributes. The rules
        come from the memo of rule shapes, as a base's do; no plan, no candidate set."""
        # the shape: the variables' names (a tuple of interned strings, hashed once each),
        # then the values of the guard-tested ones among them (one C-speed itemgetter);
        # another order of the same names is another entry, never another answer
        names = tuple(vars)
        entry = self._row_checks.get(names)
        if entry is None:
            entry = self._row_names(names)
        tested, checks = entry
        try:
            key = tested(vars) if tested is not None else None
            check = checks.get(key)
        except TypeError:  # an unhashable value (only through `Request.of`)
            key, check = _ABSENT, None
        if check is None:
            check = RowCheck([cr.rule for cr in self._rule_shape(vars)[0]], self._static_bit, self.rows.position).fn
            if key is not _ABSENT:
                if len(checks) >= RULE_SHAPES:
                    checks.clear()
                checks[key] = check
        return check

    def _row_names(self, names: tuple[str, ...]) -> tuple[Callable[[Vars], Any] | None, dict[Any, RowFn]]:
        """The memo entry of requests carrying these variables: what reads their
        guard-tested values (None when they carry none), and the checks by those values."""
        present = [n for n in self._tested_vars if n in names]
        entry: tuple[Callable[[Vars], Any] | None, dict[Any, RowFn]] = (itemgetter(*present) if present else None), {}
        if len(self._row_checks) >= RULE_SHAPES:
            self._row_checks.clear()
        self._row_checks[names] = entry
        return entry

    def _rule_shape(self, vars: Vars) -> _RuleShape:
        """The rules that apply to requests like `vars`, their terms split by whether they read
        the reduced variable, and the lone ordering (when there is one)."""
        rules: list[CompiledRule] = []
        exact: list[BitmapFn] = []
        ranged: list[tuple[BitmapFn, WithinFn | None]] = []
        orderings: list[Ordering | None] = []
        for cr, reads_range in self._ranged:
            if cr.applies(vars):
                rules.append(cr)
                if reads_range:
                    ranged.append((cr.require, cr.within))
                    orderings.append(cr.ordering)
                else:
                    exact.append(cr.require)
        ordering = None
        if len(orderings) == 1:  # one rule reads the reduced variable: a lone ordering is answered by ranks
            o = orderings[0]
            if o is not None and self.reducers.get(o.var) is self.attr_index[o.attr]:
                ordering = o
        # what a base's bitmap and Bloom clauses read: the requirements' variables (a guard's
        # are in the rules already), less the reduced ones (the ranged terms run per plan)
        reads = set().union(*(value_reads(cr.rule.require) for cr in rules)) - self.reducers.keys()
        return (tuple(rules), tuple([cr.applied for cr in rules]), tuple(exact), tuple(ranged), ordering,
                tuple([cr.rule.id for cr in rules]), tuple(sorted(reads)))

    def _refresh_base(self, base: Base, counted: bool = True) -> None:
        """Recompute a base: Bloom first, then the exact terms intersected smallest first
        (each intersection can only shrink the answer). `counted`: in the Bloom statistics
        (a request's computation; `prebuild`'s is not)."""
        base.version = self.version
        if base.clauses:
            bloom = self.bloom
            if base.bloom_version != bloom.version:
                base.kept = len(bloom.surviving(base.clauses))
                base.bloom_version = bloom.version
            total = len(bloom.shards)
            kept = base.kept
            if counted:
                st = self.stats
                st.requests += 1
                st.shards_probed += total
                st.shards_skipped += total - kept
                if not kept:
                    st.emptied += 1
            if not kept:
                base.bm, base.count = EMPTY, 0
                return
        live = len(self.live)
        if not base.exact:
            base.bm, base.count = None, live
            return
        v = base.vars
        bms = []
        for t in base.exact:
            bm = t(v)
            n = len(bm)
            if not n:
                base.bm, base.count = EMPTY, 0
                return
            if n != live:  # every term is a subset of the live set: a full one changes nothing
                bms.append((n, bm))
        if not bms:
            base.bm, base.count = None, live
            return
        if len(bms) == 1:
            base.bm, base.count = bms[0][1], bms[0][0]  # the index's own bitmap: shared, never mutated
            return
        bms.sort(key=lambda p: p[0])
        cand = bms[0][1] & bms[1][1]
        for _, bm in bms[2:]:
            if not cand:
                break
            cand &= bm  # our own bitmap from here on
        base.bm, base.count = cand, len(cand)

    def _refresh(self, plan: Plan) -> None:
        """Recompute a plan's candidates: its base's (recomputed first when the fleet
        changed), intersected with the range terms at the plan's own values."""
        plan.version = self.version
        base = plan.base
        if base.version != self.version:
            self._refresh_base(base)
        if not base.count:
            plan.cand, plan.count = EMPTY, 0
            return
        cand = base.bm
        v = plan.vars
        live = len(self.live)
        small = base.count <= SMALL_BASE
        for t, within in base.ranged:
            if small and cand is not None:  # a few candidates: met with the term directly
                cand = within(v, cand) if within is not None else cand & t(v)
                continue
            bm = t(v)
            n = len(bm)
            if not n:
                plan.cand, plan.count = EMPTY, 0
                return
            if n == live:  # a subset of the live set as large as it: changes nothing
                continue
            cand = bm if cand is None else cand & bm
        if cand is None:
            plan.cand, plan.count = self.live, len(self.live)
            return
        plan.cand = cand
        plan.count = base.count if cand is base.bm else len(cand)

    def evaluate(self, vars: Vars) -> tuple[BitMap, list[CompiledRule]]:
        """The candidate bitmap (may be the index's own: do not mutate) and applied rules."""
        plan = self.plan(vars)
        assert plan.cand is not None  # `plan` returns a plan with current candidates
        return plan.cand, list(plan.rules)
