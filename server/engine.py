"""The decision engine: request → feasibility → match → placement, with no gRPC in it.

Order matters for cost: the solver's feasibility answer is cached by request shape
(microseconds) and rejects impossible requests before any index scan; the matcher's
indexed best-k over distinct (model, GPU) comes next; the placer chooses a GPU among the
best candidates of the best-scoring model, a window of them at a time. A decision reads
`self.state` exactly once (see `state.py`), so a reload never mixes bundles. Registration,
deregistration and reloads are serialised by one writer lock; decisions never take it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from typing import Callable, Iterable

from policyc.compiler.bundle import Bundle, Contract
from policyc.compiler.diagnostic import error
from policyc.compiler.semantics import applicable_rules, require_holds
from policyc.matcher import AdmissionError, Instance, RegistryError, UnknownInstanceError, admission_problems
from policyc.matcher.columns import InstanceBatch
from policyc.placer import NoPlacement, PlacementPlan, Placer
from policyc.placer.catalog import catalog_for
from policyc.placer.llm_price import request_price
from policyc.solver.feasibility import Feasible, Infeasible

from .decision_ids import new_decision_id
from .decision import Account, Decision, DecisionInput, Outcome, Rejection, Stage, Timing
from .errors import ServiceError, Status
from .prepared import Matched as _Matched, MatchMemo, Prepared, Ranked
from .request_input import to_request
from .state import PolicyState, build_state

MODEL_FANOUT = 4  # best-k is widened this much so that other models can be tried
SCORE_LAG = 0.2  # seconds a request shape's ranking may trail the pushed scores (one refresher tick)
DEFAULT_BUDGET = 1.0  # seconds, for a contract without an SLO and a request without one
RANKED_SHAPES = 4096  # reduced request shapes whose ranked answer the engine keeps (LRU)
# A gateway's pick (a routable-only request) sees its whole pool in one window, up to this
# many endpoints: the placer's measured signals (queue, KV cache, in flight, prefix affinity)
# describe endpoints, and they can only choose an idle one that is in the window. With the
# static window of `candidates` (8), every request of one shape went to the same 8 best-scored
# of 32 servers while 24 stood idle (benchmarks/RESULTS.md, SLO attainment: 94.9 % at 8, 99.6 %
# with all 32 in the window). Beyond this many, the next windows follow as before.
ROUTABLE_WINDOW = 64


class DecisionEngine:
    def __init__(self, state: PolicyState, placer: Placer, *, candidates: int = 8,
                 score_of: Callable[[str, str], float | None] | None = None, score_lag: float = SCORE_LAG,
                 routable_window: int = ROUTABLE_WINDOW) -> None:
        if candidates < 1 or routable_window < 1:
            raise ValueError(f"candidates and routable_window must be at least 1, got {candidates} and {routable_window}")
        self.routable_window = max(routable_window, candidates)  # a gateway's window: its pool, up to this many
        self._state = state
        self._slo_vars = state.bundle.latency_targets  # the request's latency target, as the compiler found it
        self.placer = placer
        self.candidates = candidates
        self._score_of = score_of
        self._write = threading.Lock()
        # Bumped after every registration and removal, so a MatchMemo filled before it is
        # recomputed; score pushes bump `_scores`, and a memo older than `score_lag` seconds
        # that has not seen the latest is recomputed (the ranking may trail the placer's
        # scores by about one tick, never the registry's contents).
        self._generations = itertools.count(1)
        self._generation = 0
        self._scores = 0
        self.score_lag = score_lag
        self._reload_listeners: list[Callable[[PolicyState], None]] = []
        self._ranked_shapes: OrderedDict[tuple, Ranked] = OrderedDict()  # reduced shape -> the matcher's answer (LRU)
        self._ranked_lock = threading.Lock()

    # ------------------------------------------------------------------ reading
    @property
    def state(self) -> PolicyState:
        return self._state

    @property
    def generation(self) -> int:
        """Bumped by every registration, removal and bulk registration."""
        return self._generation

    def on_reload(self, listener: Callable[[PolicyState], None]) -> None:
        self._reload_listeners.append(listener)

    def decide(self, inp: DecisionInput) -> Decision:
        """Admit or reject; raises ServiceError only for bad input (never for a rejection)."""
        return self._decide(self._state, inp)

    def _budget(self, contract: Contract, vars) -> float:  # type: ignore[no-untyped-def]
        budget = contract.slo.latency if contract.slo is not None else DEFAULT_BUDGET
        for v in self._slo_vars:
            x = vars.get(v)
            if isinstance(x, float) and x > 0:
                budget = min(budget, x)
        return budget

    def prepare(self, inp: DecisionInput, st: PolicyState | None = None, *, solve: bool = True) -> Prepared:
        """Parse `inp` and ask the solver about it, against `st` (default: the current state):
        the part of a decision every request of the same shape shares, so the service can
        keep it per request shape. Raises ServiceError for bad input. `solve=False`: never
        run Z3 here (the answer may be `Pending`; the serving loop then awaits the solver
        in a worker thread, `service.decide_bytes`)."""
        st = self._state if st is None else st
        clock = time.perf_counter
        t0 = clock()
        req, retry = to_request(st.registry, st.bundle, inp)
        t1 = clock()
        answer = st.feasibility.check(req.vars) if solve else st.feasibility.lookup(req.vars)
        return Prepared(st, inp, req, retry, answer, t1 - t0, clock() - t1)

    def decide_prepared(self, prep: Prepared, memo: MatchMemo | None = None, lookup: float | None = None) -> Decision:
        """Decide a prepared request. `memo` (one per request shape) keeps the match result
        while the registry is unchanged; `lookup` is the seconds spent finding `prep` in a
        cache (reported as the parse stage) when it was not prepared for this decision."""
        return self._decide_prepared(prep, memo, lookup)

    def _decide(self, st: PolicyState, inp: DecisionInput) -> Decision:
        return self._decide_prepared(self.prepare(inp, st), None, None)

    def _matched(self, prep: Prepared, memo: MatchMemo | None) -> _Matched:
        """The matcher's answer for `prep` and what placement needs from it, from `memo`
        when no instance was registered or removed since it was filled and it has seen the
        latest score push or is younger than `score_lag`; else from the answer shared by
        its reduced shape (`_ranked`), with this request's budgets and session."""
        gen, scores, now = self._generation, self._scores, time.monotonic()
        if memo is not None:
            hit = memo.entry
            if hit is not None and hit.generation == gen and hit.state is prep.state and \
                    (hit.scores == scores or now - hit.made_at < self.score_lag):
                return hit
        r = self._ranked(prep, gen, scores, now)
        vars_, session = prep.request.vars, prep.input.session
        budgets: dict[str, float] = {}
        tries = []
        for label, contract, window in r.windows:
            budget = budgets.get(contract.name)
            if budget is None:
                budget = budgets[contract.name] = self._budget(contract, vars_)
            tries.append((label, contract, window, budget, session))
        out = _Matched(r.generation, r.scores, r.made_at, r.state, r.result, tuple(tries), r.rejection, r.regions, r.endpoints)
        if memo is not None:
            memo.entry = out  # one reference: a reader on another thread sees the old entry or this one
        return out

    def _ranked(self, prep: Prepared, gen: int, scores: int, now: float) -> Ranked:
        """The matcher's answer for `prep`'s reduced shape, shared by every request of that
        shape while it is valid as a memo is (same registry generation and state; the
        latest score push seen, or younger than `score_lag`)."""
        st = prep.state
        routable = prep.input.routable_only
        subset = prep.input.endpoint_subset
        try:
            key: tuple | None = (st.registry.index.shape_key(prep.request.vars)[0], routable, subset)
        except TypeError:  # an unhashable value (only through `Request.of`): ranked afresh
            key = None
        table = self._ranked_shapes
        if key is not None:
            with self._ranked_lock:
                hit = table.get(key)
                if hit is not None and hit.generation == gen and hit.state is st and \
                        (hit.scores == scores or now - hit.made_at < self.score_lag):
                    table.move_to_end(key)
                    return hit
        # a candidate subset: every admitted instance is ranked, then only the subset's kept
        n = self.routable_window if routable else self.candidates  # a gateway's pick: its pool in one window
        m = st.registry.match(prep.request, n * MODEL_FANOUT if subset is None else max(1, len(st.registry)),
                              distinct_gpus=True, routable=routable)
        rej: Rejection | None = None
        windows: list[tuple[str, Contract, tuple[Instance, ...]]] = []
        if not m.admitted:
            ex = st.registry.explain(prep.request)
            blocking = tuple(r for r in ex.rules if r.applied and r.eliminated > 0)
            parts = [f"`{r.id}` ({r.origin}) excludes {r.eliminated} of {ex.live}" for r in blocking]
            reason = ("no live instance satisfies the applicable rules: " + "; ".join(parts)) if parts else \
                ("no instances are registered" if ex.live == 0 else "no live instance satisfies the applicable rules")
            if routable and ex.count > 0:  # the rules admit instances, none a gateway can reach: none can serve
                reason, blocking = _routable_rejection(st.registry, st.bundle, prep.request.vars, ex.count), ()
            rej = Rejection(Stage.MATCH, reason, tuple(r.id for r in blocking), tuple(r.origin for r in blocking), blocking)
        else:
            # Models in the order of their best candidate's score, each model's candidates
            # in windows of `candidates` (best first; a gateway's pick: `routable_window`,
            # its whole pool up to that many): the next window is tried only when
            # the placer finds no feasible GPU in this one (the best few can run out of
            # share within a tick while the model's next ones have room), and the next
            # model only when none of this one's windows has.
            groups: dict[str, list[Instance]] = {}
            for s in m.best:
                if subset is None or s.instance.deployment.endpoint in subset:
                    groups.setdefault(s.instance.model, []).append(s.instance)
            if not groups:  # the rules admit instances, none of them in the gateway's subset
                rej = Rejection(Stage.MATCH, f"none of the {m.count} admissible instances has an endpoint in the gateway's "
                                f"candidate subset ({', '.join(sorted(subset or ()))[:300] or 'empty'})")
            for model, cands in groups.items():
                contract = st.bundle.contract(model)
                assert contract is not None  # admission guarantees it
                for i in range(0, len(cands), n):
                    window = tuple(cands[i:i + n])
                    windows.append((_window_label(model, i, len(window)), contract, window))
        out = Ranked(gen, scores, now, st, m, rej, tuple(windows),
                     {c.id: c.deployment.region for _, _, cands in windows for c in cands},
                     {c.id: c.deployment.endpoint for _, _, cands in windows for c in cands if c.deployment.endpoint})
        if key is not None:
            with self._ranked_lock:
                table[key] = out
                table.move_to_end(key)
                if len(table) > RANKED_SHAPES:
                    table.popitem(last=False)  # the least recently used
        return out

    def _decide_prepared(self, prep: Prepared, memo: MatchMemo | None, lookup: float | None) -> Decision:
        clock = time.perf_counter
        t2 = clock()
        st, answer = prep.state, prep.answer
        parse, feas = (prep.parse, prep.feasibility) if lookup is None else (lookup, 0.0)
        did = new_decision_id()
        vars_ = prep.request.vars
        tenant = prep.request.tenant
        retry = prep.retry
        if isinstance(answer, Infeasible):
            kept = memo.refused if memo is not None else None
            if kept is not None and kept[0] is answer:
                rej = kept[1]
            else:
                rej = Rejection(Stage.FEASIBILITY, answer.reason, answer.rule_ids, answer.spans)
                if memo is not None:
                    memo.refused = (answer, rej)
            return Decision(did, Outcome.REJECTED, st.bundle_hash, None, vars_, (), 0, None, None, rej,
                            Timing(parse, feas, 0.0, 0.0, parse + feas + clock() - t2), retry, tenant)
        mt = self._matched(prep, memo)
        m = mt.result
        t3 = clock()
        if mt.rejection is not None:
            return Decision(did, Outcome.REJECTED, st.bundle_hash, None, vars_, m.rules, 0, None, None, mt.rejection,
                            Timing(parse, feas, t3 - t2, 0.0, parse + feas + clock() - t2), retry, tenant)
        refusals: list[tuple[str, NoPlacement]] = []
        plan: PlacementPlan | NoPlacement | None = None
        model = ""
        for label, contract, cands, budget, session in mt.tries:
            # an LLM request is priced by its own prompt and max_tokens, not the contract's constant
            price = request_price(contract, vars_) if contract.llm is not None else None
            plan = self.placer.place(cands, budget, contract, session) if price is None else \
                self.placer.place(cands, budget, contract, session, price=price)
            if isinstance(plan, PlacementPlan):
                model = contract.name
                break
            refusals.append((label, plan))
        t4 = clock()
        if not isinstance(plan, PlacementPlan):
            first_model, first = mt.tries[0][1].name, refusals[0][1]
            reason = "; ".join(f"`{mod}`: {np.message}" for mod, np in refusals)
            rej = Rejection(Stage.PLACEMENT, reason, binding=first.binding.value, gpus=first.rejected)
            return Decision(did, Outcome.REJECTED, st.bundle_hash, first_model, vars_, m.rules, m.count, None, None, rej,
                            Timing(parse, feas, t3 - t2, t4 - t3, parse + feas + clock() - t2), retry, tenant)
        region = mt.regions.get(plan.instance_id)
        notes = tuple(f"`{mod}` was tried first: {np.message}" for mod, np in refusals) if refusals else ()
        return Decision(did, Outcome.ADMITTED, st.bundle_hash, model, vars_, m.rules, m.count, plan, region, None,
                        Timing(parse, feas, t3 - t2, t4 - t3, parse + feas + clock() - t2), retry, tenant, notes,
                        mt.endpoints.get(plan.instance_id, ""))

    def explain(self, inp: DecisionInput, prepared: Prepared | None = None) -> Account:
        """The decision for `inp` with the matcher's per-rule account. `prepared`: `inp`
        prepared with its feasibility answer (the service's, solved off the serving loop);
        the account then reads its state, and no Z3 call runs here. Without it, the
        solver may run in this thread."""
        if prepared is None:
            prepared = self.prepare(inp, self._state)
        st = prepared.state
        d = self._decide_prepared(prepared, None, None)
        req, answer = prepared.request, prepared.answer
        feas = answer.reason if isinstance(answer, Infeasible) else (
            "feasible: some declared instance can serve this request" if isinstance(answer, Feasible) else f"undecided: {answer.reason}")
        ex = st.registry.explain(req) if d.rejection is None or d.rejection.stage is not Stage.FEASIBILITY else None
        return Account(d, feas, ex, tuple(narrate(d, feas, ex)))

    # ------------------------------------------------------------------ writing
    def register(self, instance: Instance, score: float | None = None) -> int:
        """Add an instance; returns the registry size. ServiceError says why not."""
        with self._write:
            st = self._state
            if score is None and self._score_of is not None:  # still None: its group's score
                score = self._score_of(instance.deployment.host, instance.deployment.gpu)
            try:
                st.registry.add(instance, score)
            except AdmissionError as e:
                unknown = any(p.startswith("unknown model") for p in e.problems)
                raise ServiceError(Status.NOT_FOUND if unknown else Status.FAILED_PRECONDITION, str(e), e.problems,
                                   diagnostics=tuple(error("E720" if unknown else "E721", p, field="model" if unknown else "deployment")
                                                     for p in e.problems)) from None
            except RegistryError as e:
                status = Status.ALREADY_EXISTS if "already registered" in str(e) else Status.INVALID_ARGUMENT
                raise ServiceError(status, str(e)) from None
            self._generation = next(self._generations)
            return len(st.registry)

    def register_many(self, instances: Iterable[Instance], scores: dict[str, float] | None = None) -> int:
        """Bulk registration (all or nothing): the fast path for fleets and benchmarks.
        Instances without a given score take their GPU's current placer score, as
        `register` does (so the score pusher only has to send what moves afterwards)."""
        items = list(instances)
        if self._score_of is not None:
            given = scores or {}
            scores = dict(given)
            for inst in items:
                if inst.id not in given:
                    s = self._score_of(inst.deployment.host, inst.deployment.gpu)
                    if s is not None:
                        scores[inst.id] = s
        with self._write:
            try:
                self._state.registry.add_many(items, scores)
            except RegistryError as e:
                raise ServiceError(Status.FAILED_PRECONDITION, str(e)) from None
            self._generation = next(self._generations)
            return len(self._state.registry)

    def register_batch(self, batch: InstanceBatch) -> int:
        """Bulk registration from columns (`bulk_registration.py` screens the rows first),
        all or nothing, no `Instance` object per row. Rows without a score take their GPU's
        current placer score, as `register` does."""
        if self._score_of is not None and (not batch.scores or None in batch.scores):
            given = batch.scores or [None] * len(batch)
            hosts, gpus, score_of = batch.strs["host"], batch.strs["gpu"], self._score_of
            batch.scores = [score_of(h, g) if s is None else s for s, h, g in zip(given, hosts, gpus)]
        with self._write:
            try:
                self._state.registry.add_batch(batch)
            except RegistryError as e:
                raise ServiceError(Status.FAILED_PRECONDITION, str(e)) from None
            self._generation = next(self._generations)
            return len(self._state.registry)

    def deregister(self, instance_id: str) -> int:
        with self._write:
            st = self._state
            try:
                st.registry.remove(instance_id)
            except UnknownInstanceError as e:
                raise ServiceError(Status.NOT_FOUND, str(e)) from None
            self._generation = next(self._generations)
            return len(st.registry)

    def reload(self, bundle: Bundle, *, evict_inadmissible: bool = False) -> tuple[str, tuple[str, ...]]:
        """Swap to `bundle` atomically: the new registry and feasibility cache are built
        beside the old ones, then one reference changes. Returns (previous hash, evicted)."""
        with self._write:
            old = self._state
            entries = old.registry.entries()
            keep: list[tuple[Instance, float]] = []
            evicted: list[tuple[str, str]] = []
            refused: list[tuple[str, str]] = []
            for inst, _, score in entries:
                problems = admission_problems(inst, bundle)
                if problems:
                    (evicted if evict_inadmissible else refused).append((inst.id, problems[0]))
                else:
                    keep.append((inst, score))
            if refused:
                shown = "; ".join(f"{i}: {p}" for i, p in refused[:5])
                more = f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
                raise ServiceError(Status.FAILED_PRECONDITION,
                                   f"the new bundle does not admit {len(refused)} registered instance(s): {shown}{more}; "
                                   "reload with evict_inadmissible to drop them")
            new = build_state(bundle, [i for i, _ in keep], {i.id: s for i, s in keep})
            new.feasibility.warm(old.feasibility.seen())  # every shape seen so far, solved before the swap
            for listener in self._reload_listeners:
                listener(new)  # e.g. the guardian's rule tables: raises before anything is swapped
            self.placer.load_catalog(catalog_for(bundle.gpu_catalog))  # the new bundle's GPU classes, everywhere
            self._slo_vars = bundle.latency_targets
            self._state = new
            with self._ranked_lock:
                self._ranked_shapes = OrderedDict()  # the old state's answers: never valid again, and they hold it
            old.feasibility.close()
            return old.bundle_hash, tuple(i for i, _ in evicted)

    def groups_on(self, host: str, gpu: str) -> int:
        """How many (model, GPU) groups this GPU holds: what a score push for it moves."""
        return self._state.registry.groups_on(host, gpu)

    def push_scores(self, changes: Iterable[tuple[str, str, float]]) -> int:
        """Apply the placer's GPU score changes to the groups on those GPUs, as one
        `Registry.set_gpu_scores` batch (a score pusher's chunk is one call here); returns
        the groups moved."""
        moved = self._state.registry.set_gpu_scores([(h, g, min(1.0, max(0.0, s))) for h, g, s in changes])
        if moved:
            self._scores += 1
        return moved


def _routable_rejection(registry, bundle: Bundle, vars, fleet: int) -> str:  # type: ignore[no-untyped-def]
    """Why no instance with an endpoint matched when `fleet` instances without one do: what
    excluded the ones a gateway can reach (a few: evaluated one by one, as the naive scan does)."""
    head = f"{fleet} live instance(s) satisfy the applicable rules, but none has an endpoint a gateway can send traffic to"
    pool = registry.routable_entries()
    if not pool:
        return head + "; no instance with an endpoint is registered"
    rules = applicable_rules(bundle.rules, vars)
    parts = [f"`{r.id}` ({r.origin}) excludes {n}" for r in rules
             if (n := sum(not require_holds(r.require, a, vars) for a in pool))]
    return head + f"; of the {len(pool)} with one, " + ("; ".join(parts) if parts else "none satisfies them")


def _window_label(model: str, start: int, size: int) -> str:
    """How a refusal names a try: the model for its first window, then which of its
    candidates (1-based) the window held."""
    if start == 0:
        return model
    if size == 1:
        return f"{model} (candidate {start + 1})"
    return f"{model} (candidates {start + 1}-{start + size})"


def narrate(d: Decision, feasibility: str, ex) -> list[str]:  # type: ignore[no-untyped-def]
    """The account in sentences, in the order the engine decided."""
    lines = [f"bundle {d.bundle_hash[:19]}…; request variables: "
             + (", ".join(f"{k}={v}" for k, v in sorted(d.variables.items())) or "none")]
    lines.append(f"solver: {feasibility}")
    if ex is not None:
        lines.append(f"matcher: {ex.count} of {ex.live} live instances satisfy every applicable rule "
                     f"(Bloom filter skipped {ex.shards_skipped_by_bloom} of {ex.shards} shards)")
        for r in ex.rules:
            if not r.applied:
                lines.append(f"  rule `{r.id}` ({r.origin}) does not apply: {r.why}")
                continue
            lines.append(f"  rule `{r.id}` ({r.origin}) applies: excludes {r.eliminated} on its own, "
                         f"{r.eliminated_in_order} after the rules before it")
            for p in r.predicates:
                lines.append(f"    `{p.predicate}` ({p.origin}) fails on {p.failing} instance(s)")
    if d.plan is not None:
        lines.append(f"placer: {d.plan.reasons[0]}")
        lines.extend(f"  {x}" for x in (*d.plan.reasons[1:], *d.notes))
        for rj in d.plan.rejected:
            lines.append(f"  not {rj.gpu}: {rj.constraint.value} ({rj.detail})")
    if d.rejection is not None:
        lines.append(f"rejected at {d.rejection.stage.value}: {d.rejection.reason}")
        for g in d.rejection.gpus[:8]:
            lines.append(f"  not {g.gpu}: {g.constraint.value} ({g.detail})")
    else:
        lines.append(f"admitted: {d.model} on {d.plan.gpu_key if d.plan else '?'}")
    return lines

