"""Runtime request feasibility: can any declared instance serve this request at all?

The decision service asks before any index scan. A request is infeasible when it falls
outside its headers' declared values or ranges, or when the requirements of the rules
that apply to it conflict with every instance the bundle's contracts allow (region
`mars-1`, an SLO below every contract's). The reason names the rules and their spans.

Answers are cached by request *shape*: variables whose value cannot change the answer
are merged (a quantity is reduced to its position among the thresholds it is compared
with; names, strings and flags are kept as they are), so a warm check is one key build
and one dict lookup — microseconds. The cache is a bounded LRU (the oldest shape goes,
one at a time; nothing is dropped wholesale).

Two ways to ask. `check` answers now, running Z3 (milliseconds, under a lock) on a miss:
for the CLI, Explain, tests. `lookup` is what the serving path calls and never runs Z3:
a miss is answered at once by the checks that need no solver (outside the declared
domain: infeasible; no rule applies: feasible) or else `PENDING`, and the shape is queued
for the solver thread, which fills the cache off the serving loop; the matcher (exact
over the live fleet) decides a pending request meanwhile, so nothing is admitted that
the rules do not admit. `warm` solves a list of shapes in the caller's thread: a reload
solves every shape the old state had seen before the new state goes live.
`solves_inline`, `solves_background`, `pending` and `solves_on_loop` (Z3 in a thread that
runs an asyncio event loop: the serving loop's promise is that this stays 0) count what
happened.
"""

from __future__ import annotations

import asyncio
import bisect
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Iterable, Mapping, Union

import z3

from policyc.compiler.bundle import Atom, Bundle, Scalar, SourceRef, Test
from policyc.compiler.meaning import CONTRACT_QUANTITIES, fixed_quantity
from policyc.placer.catalog import catalog_for

from .classes import group
from .domains import QUANTITY_TYPES, domains, leaves
from .encode import RuleEncoder
from policyc.compiler.semantics import rule_applies
from .space import Space
from .token_feasibility import first_token_bounds, first_token_refusal
from .verdict import Verdict, new_solver, verdict

FIXED_ATTRS = CONTRACT_QUANTITIES  # one value per contract


@dataclass(frozen=True, slots=True)
class Feasible:
    feasible: bool = True


@dataclass(frozen=True, slots=True)
class Infeasible:
    reason: str
    rule_ids: tuple[str, ...] = ()
    spans: tuple[SourceRef, ...] = ()
    feasible: bool = False


@dataclass(frozen=True, slots=True)
class Undecided:
    """Z3 could not answer in time; the caller decides (never folded into yes or no)."""

    reason: str
    feasible: None = None


@dataclass(frozen=True, slots=True)
class Pending:
    """Not solved yet (`lookup` queued it): the matcher decides this request alone."""

    reason: str = "the solver has not answered for this request shape yet"
    feasible: None = None


Answer = Union[Feasible, Infeasible, Undecided, Pending]
FEASIBLE = Feasible()
PENDING = Pending()
_ABSENT = object()
DEFAULT_MAX_CACHE = 1 << 16


class RequestFeasibility:
    def __init__(self, bundle: Bundle, *, max_cache: int = DEFAULT_MAX_CACHE) -> None:
        self.bundle = bundle
        self.dom = domains(bundle)
        # a Z3 context of its own: this solver runs in its own thread (and callers' under
        # `_lock`) while other states' solvers, a reload's new one among them, are built and
        # run in others; terms of one context made, checked or freed in two threads at once
        # crash the process
        self.space = Space(z3.Context())
        self.enc = RuleEncoder(self.space, self.dom)
        self.max_cache = max_cache
        self._cache: OrderedDict[tuple, Answer] = OrderedDict()
        self._seen: dict[tuple, dict[str, Scalar]] = {}  # a request of each cached shape, for `warm` after a reload
        self._lock = threading.Lock()
        self._queued: dict[tuple, Future[Answer]] = {}  # shapes waiting for the solver thread
        self._work: queue.SimpleQueue[tuple[tuple, dict[str, Scalar]] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.solves_inline = 0  # Z3 runs in a caller's thread (`check`, `warm`)
        self.solves_background = 0  # Z3 runs in the solver thread (shapes `lookup` queued)
        self.pending = 0  # `lookup`s answered PENDING
        self.solves_on_loop = 0  # Z3 runs in a thread running an asyncio event loop (a serving loop): should stay 0
        self._headers = {h.var: h for h in bundle.headers}
        self._vars = tuple(sorted(v for v in self.dom.vars))
        self._breaks = {v: self._breakpoints(v) for v in self._vars}
        self._solver = new_solver(ctx=self.space.ctx)
        self._solver.set("core.minimize", True)
        classes = group(bundle.contracts, self.dom)  # one disjunct per instance class, not per contract
        for c in classes:
            self.space.reserve(c.names)
        self._solver.add(self.enc.instance_frame(), self.enc.fleet_domain(classes), *self.space.axioms)
        # LLM contracts' first-token bounds: asked per request before the shape cache (`_by_tokens`)
        self._first_token = first_token_bounds(bundle.contracts, catalog_for(bundle.gpu_catalog))
        self._rule_lits = {}
        for r in bundle.rules:
            lit = z3.Bool(f"rule:{r.id}", self.space.ctx)
            self._solver.add(z3.Implies(lit, self.enc.require(r)))
            self._rule_lits[r.id] = lit

    # ------------------------------------------------------------------ shapes
    def _breakpoints(self, var: str) -> tuple[float, ...] | None:
        """Thresholds a quantity variable is compared with, or None when exact values matter."""
        vd = self.dom.vars[var]
        if vd.type not in QUANTITY_TYPES:
            return None
        points: set[float] = set()
        if vd.range is not None:
            points.update((vd.range.lo, vd.range.hi))
        for r in self.bundle.rules:
            for leaf in (*leaves(r.guard), *leaves(r.require)):
                if isinstance(leaf, Test) and leaf.var == var and leaf.operand is not None:
                    v = leaf.operand.value
                    points.update(float(x) for x in (v if isinstance(v, tuple) else (v,)))
                elif isinstance(leaf, Atom) and leaf.operand.kind == "var" and leaf.operand.name == var:
                    if leaf.attr not in FIXED_ATTRS:
                        return None
                    for c in self.bundle.contracts:
                        points.add(fixed_quantity(c, leaf.attr))
        points.add(0.0)
        return tuple(sorted(points))

    def shape(self, variables: Mapping[str, Scalar]) -> tuple:
        """The cache key: equal keys are guaranteed equal answers."""
        key = []
        for v in self._vars:
            x = variables.get(v, _ABSENT)
            bp = self._breaks[v]
            if x is _ABSENT or bp is None or isinstance(x, (bool, str)):
                key.append(x if x is not _ABSENT else _ABSENT)
            else:
                i = bisect.bisect_left(bp, float(x))  # type: ignore[arg-type]  # a number: the others took the branch above
                key.append(2 * i + (i < len(bp) and bp[i] == x))
        return tuple(key)

    # ------------------------------------------------------------------ checks
    def check(self, variables: Mapping[str, Scalar]) -> Answer:
        """Cached: the answer for this request's shape (Z3 in this thread on a miss)."""
        by_tokens = self._by_tokens(variables)
        if by_tokens is not None:
            return by_tokens
        key = self.shape(variables)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        self.solves_inline += 1
        answer = self.solve(variables)
        self._store(key, variables, answer)
        return answer

    def lookup(self, variables: Mapping[str, Scalar]) -> Answer:
        """The serving path's question: the cached answer, or one that needs no solver,
        or `PENDING` with the shape queued for the solver thread. Never runs Z3."""
        by_tokens = self._by_tokens(variables)
        if by_tokens is not None:
            return by_tokens
        key = self.shape(variables)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        quick = self._without_solver(variables)
        if quick is not None:
            self._store(key, variables, quick)
            return quick
        self.pending += 1
        self._enqueue(key, variables)
        return PENDING

    def solved(self, variables: Mapping[str, Scalar]) -> Future[Answer]:
        """A future of this shape's answer from the solver thread (done at once when
        cached): what a serving loop awaits instead of running Z3 itself. Requests of one
        new shape share one solve."""
        key = self.shape(variables)
        hit = self._by_tokens(variables) or self._cache.get(key)
        if hit is not None:
            f: Future[Answer] = Future()
            f.set_result(hit)
            return f
        return self._enqueue(key, variables)

    def _enqueue(self, key: tuple, variables: Mapping[str, Scalar]) -> Future[Answer]:
        with self._start_lock:
            f = self._queued.get(key)
            if f is None:
                f = self._queued[key] = Future()
                self._work.put((key, dict(variables)))
            if self._worker is None:
                self._worker = threading.Thread(target=self._solve_queued, name="policyc-feasibility", daemon=True)
                self._worker.start()
        return f

    def cached(self, variables: Mapping[str, Scalar]) -> Answer | None:
        """The cached answer only (None when the shape is not solved yet)."""
        return self._cache.get(self.shape(variables))

    def warm(self, requests: Iterable[Mapping[str, Scalar]]) -> int:
        """Solve every shape among `requests` now, in this thread (a reload's, before the
        new state serves); returns how many were new."""
        n = 0
        for variables in requests:
            key = self.shape(variables)
            if key in self._cache:
                continue
            self.solves_inline += 1
            self._store(key, variables, self.solve(variables))
            n += 1
        return n

    def seen(self) -> list[dict[str, Scalar]]:
        """One request of every cached shape, most recently used last (what `warm` takes)."""
        return [self._seen[k] for k in list(self._cache) if k in self._seen]

    def close(self) -> None:
        """Stop the solver thread once the shapes queued so far are solved (a state that is
        no longer served)."""
        with self._start_lock:
            if self._worker is not None:
                self._work.put(None)

    def _store(self, key: tuple, variables: Mapping[str, Scalar], answer: Answer) -> None:
        cache = self._cache
        if key in cache:
            cache.move_to_end(key)
        elif len(cache) >= self.max_cache:
            old, _ = cache.popitem(last=False)
            self._seen.pop(old, None)
        cache[key] = answer
        self._seen[key] = dict(variables)

    def _solve_queued(self) -> None:
        while True:
            item = self._work.get()
            if item is None:  # closed: a later enqueue (a request still holding this state) starts a new thread
                with self._start_lock:  # (enqueues hold this lock too: none is lost between the check and the exit)
                    if not self._work.empty():
                        continue
                    self._worker = None
                return
            key, variables = item
            with self._start_lock:
                f = self._queued.get(key)
            try:
                answer = self._cache.get(key)
                if answer is None:
                    answer = self.solve(variables)
                    self.solves_background += 1
                    self._store(key, variables, answer)
                if f is not None:
                    f.set_result(answer)
            except Exception as exc:  # noqa: BLE001 - handed to whoever waits for this shape
                if f is not None:
                    f.set_exception(exc)
            finally:
                with self._start_lock:
                    self._queued.pop(key, None)

    def _by_tokens(self, variables: Mapping[str, Scalar]) -> Infeasible | None:
        """An LLM request whose prefill cannot meet its contract's TTFT on any GPU class
        (`token_feasibility.py`): exact per request, so never cached by shape."""
        refused = first_token_refusal(self._first_token, variables)
        return None if refused is None else Infeasible(refused[0], (), (refused[1],))

    def _without_solver(self, variables: Mapping[str, Scalar]) -> Answer | None:
        """`solve`'s answers that need no Z3 (outside the domain; no rule applies)."""
        req = self._with_class(variables)
        bad = self._outside_domain(req)
        if bad is not None:
            return bad
        if not any(rule_applies(r, req) for r in self.bundle.rules):
            return FEASIBLE if self.bundle.contracts else Infeasible("the bundle declares no contracts")
        return None

    def _with_class(self, variables: Mapping[str, Scalar]) -> dict[str, Scalar]:
        req = dict(variables)
        if "tenant" in req and "tenant_class" not in req and req["tenant"] in self.dom.tenants:
            req["tenant_class"] = self.dom.tenants[str(req["tenant"])]
        return req

    def solve(self, variables: Mapping[str, Scalar]) -> Answer:
        """Uncached: validate against the declared request domain, then ask Z3."""
        req = self._with_class(variables)
        bad = self._outside_domain(req)
        if bad is not None:
            return bad
        rules = [r for r in self.bundle.rules if rule_applies(r, req)]
        if not rules:
            return FEASIBLE if self.bundle.contracts else Infeasible("the bundle declares no contracts")
        if asyncio._get_running_loop() is not None:  # counted, for the serving path's promise (never on the loop)
            self.solves_on_loop += 1
        with self._lock:
            s = self._solver
            s.push()
            try:
                for name in self._vars:
                    vd = self.dom.vars[name]
                    slot = self.space.var(name, vd.type)
                    if name in req:
                        s.add(slot.present, slot.value == self.space.const(slot.kind, req[name]))  # type: ignore[arg-type]
                    else:
                        s.add(z3.Not(slot.present))  # type: ignore[arg-type]
                v = verdict(s.check(*[self._rule_lits[r.id] for r in rules]))
                core = {str(c) for c in s.unsat_core()} if v is Verdict.UNSAT else set()
            finally:
                s.pop()
        if v is Verdict.SAT:
            return FEASIBLE
        if v is Verdict.UNKNOWN:
            return Undecided("the solver did not answer in time")
        blamed = tuple(r for r in rules if f"rule:{r.id}" in core)
        ids = tuple(r.id for r in blamed)
        listed = ", ".join(f"`{i}`" for i in ids)
        return Infeasible(f"no declared instance satisfies rule{'s' * (len(ids) != 1)} {listed} for this request",
                          ids, tuple(r.origin for r in blamed))

    def _outside_domain(self, req: dict[str, Scalar]) -> Infeasible | None:
        for name, vd in self.dom.vars.items():
            h = self._headers.get(name)
            spans = (h.origin,) if h else ()
            where = f"header `{h.header}`" if h else "policyc"
            if name not in req:
                if vd.always_present:
                    return Infeasible(f"the request has no `{name}`, which {where} requires", (), spans)
                continue
            x = req[name]
            if vd.type in QUANTITY_TYPES:
                if isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0:
                    return Infeasible(f"`request.{name}` must be a non-negative quantity", (), spans)
                if vd.range is not None and not (vd.range.lo <= x <= vd.range.hi):
                    return Infeasible(f"`request.{name}` is outside the range {where} declares", (), spans)
            elif vd.values is not None and x not in vd.values:
                return Infeasible(f"`{x}` is not a declared value of `request.{name}` (one of: {', '.join(vd.values)})", (), spans)
        return None
