"""The guardian: carries out compiled circuit-break rules where per-request decisions belong.

- Request budgets: each request's deadline comes from the bundle's budget rules, on its
  contract's SLO or on the latency its placement predicted for it; when it passes, that one
  stream is cancelled (never its connection), the request is redirected to the rule's
  backup with `X-Retry-Count: 1` and its variant, and the GPU's anomaly goes to the placer.
- GPU rules: consecutive-anomaly streaks per GPU, cross-layer classification first (a
  client-network cause does not blame the GPU), then anomaly reports and self-heal through
  the one executor.
- Backend rules: quarantine through the plane, capped, expiring and backing off.
Every act is an `ActionRecord` in the audit sink.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policyc.compiler.actions import CANCEL_STREAM, KINDS, QUARANTINE, REDIRECT, REPORT_ANOMALY, SELF_HEAL
from policyc.compiler.bundle import Breaker, Bundle, Quarantine, Redirect, ReportAnomaly, SelfHeal
from policyc.enforcer.budget_watch import BudgetWatch
from policyc.enforcer.collaborators import AnomalySink, AuditSink, StreamHandle
from policyc.enforcer.connection_ender import ConnectionEnder
from policyc.enforcer.correlate import MODEL_FAULT, Classification, classify
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.executor import ActionExecutor, Fence, HealTarget, StepResult
from policyc.enforcer.plane import EnforcementPlane
from policyc.enforcer.quarantine_book import QuarantineBook
from policyc.enforcer.records import ActionKind, ActionRecord, Outcome
from policyc.enforcer.retry_budget import RetryBudget
from policyc.enforcer.rule_table import COMPARE, ELAPSED, BudgetRule, RuleTable, all_hold, build_rule_table

RETRY_HEADER = "x-retry-count"
ENDER_ROOM = 0.0015  # a socket-table walk starts only with no budget crossing nearer than this (seconds)


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """What the caller re-issues after a break: same request, backup model, these headers."""

    request_id: str
    backup: str
    variant: str | None
    headers: tuple[tuple[str, str], ...]
    rule: str


@dataclass(slots=True)
class _Ticket:
    request_id: str
    model: str
    started: float
    stream: StreamHandle
    gpu_key: str
    backend: Endpoint | None
    on_redirect: Callable[[RetryPlan], None] | None
    retry_count: int
    budget: BudgetRule | None
    budget_s: float = 0.0  # seconds after `started` at which `budget` fires
    token: int = 0
    holds_retry_slot: bool = False
    cancelled: tuple[Exception | None, float] | None = None  # the urgent cancel's error (None: done) and crossing->cancel seconds


@dataclass(slots=True)
class _Crossing:
    """One budget crossing's account, as its actions run: the cancel's seconds from the
    crossing, and the quarantine deferred to after the burst."""

    request_id: str
    crossed_at: float
    elapsed: float
    cancel_s: float | None = None
    quarantine: Quarantine | None = None


@dataclass(frozen=True, slots=True)
class BreakTiming:
    """Seconds from the budget crossing to the stream's cancel and to the kernel map update."""

    cancel_s: float
    map_update_s: float | None


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    classification: Classification | None
    fired: tuple[str, ...]  # names of rules whose actions ran
    heal: tuple[StepResult, ...] = ()


@dataclass
class _Streaks:
    counts: dict[tuple[str, str], int] = field(default_factory=dict)


class Guardian:
    def __init__(
        self,
        bundle: Bundle,
        *,
        plane: EnforcementPlane,
        anomalies: AnomalySink,
        audit: AuditSink,
        executor: ActionExecutor,
        clock: Callable[[], float] = time.monotonic,
        min_retry_concurrency: int = 1,
        heal_targets: Mapping[str, HealTarget] | None = None,
    ) -> None:
        self._plane = plane
        self._anomalies = anomalies
        self._audit = audit
        self._executor = executor
        self._clock = clock
        self._watch = BudgetWatch(clock)
        self._lock = threading.RLock()
        self._tickets: dict[str, _Ticket] = {}
        self._streaks = _Streaks()
        self._book = QuarantineBook()
        self._backups: dict[Endpoint, Endpoint] = {}
        self._backend_ids: dict[Endpoint, int] = {}
        self._heal_targets = dict(heal_targets or {})
        self._min_retry = min_retry_concurrency
        self._retry: dict[str, RetryBudget] = {}
        self._pending_slots: dict[str, str] = {}
        self._ender = ConnectionEnder(plane, self._connections_ended, room=functools.partial(self._watch.wait_for_room, ENDER_ROOM))
        self.break_timings: list[BreakTiming] = []
        # what each action does, per where it fires, keyed by the action table's words
        # (`compiler/actions.py`); an action with no entry does nothing there (the table's
        # scopes keep such rules out of the rule table)
        self._at_crossing: dict[str, Callable[[_Ticket, Breaker, Any, _Crossing], None]] = {
            CANCEL_STREAM: self._crossing_cancel, REDIRECT: self._crossing_redirect,
            REPORT_ANOMALY: self._crossing_report, QUARANTINE: self._crossing_quarantine}
        self._at_backend: dict[str, Callable[[Endpoint, Breaker, Any], None]] = {
            QUARANTINE: self._backend_quarantine, REPORT_ANOMALY: self._backend_report}
        self._at_gpu: dict[str, Callable[[str, Breaker, Any, Mapping[str, float], list[StepResult]], None]] = {
            REPORT_ANOMALY: self._gpu_report, SELF_HEAL: self._gpu_heal}
        assert {*self._at_crossing, *self._at_backend, *self._at_gpu} <= set(KINDS), "dispatch on the action table's words"
        if not plane.kernel_enforcement:
            self._record(ActionKind.CLASSIFY, "enforcer", "", Outcome.OBSERVED, "kernel enforcement is OFF: user-space plane in use")
        self.table: RuleTable = build_rule_table(bundle)
        self._plane.apply_rules(self.table.kernel_rules())

    # ----------------------------------------------------------------- bundle

    def load_bundle(self, bundle: Bundle) -> None:
        """Swap rule tables; the kernel plane's maps change, its programs stay attached."""
        table = build_rule_table(bundle)  # raises before anything changes
        with self._lock:
            self.table = table
            self._retry.clear()
        self._plane.apply_rules(table.kernel_rules())

    def _budget_of(self, rule: Breaker) -> RetryBudget:
        b = self._retry.get(rule.name)
        if b is None:
            b = self._retry[rule.name] = RetryBudget(rule.retry_budget, self._min_retry)
            for t in self._tickets.values():
                if t.budget is not None and t.budget.breaker.name == rule.name:
                    b.request_started()
        return b

    # ----------------------------------------------------------------- requests

    def begin(
        self,
        request_id: str,
        model: str,
        stream: StreamHandle,
        *,
        gpu_key: str = "",
        backend: Endpoint | None = None,
        on_redirect: Callable[[RetryPlan], None] | None = None,
        retry_count: int = 0,
        started: float | None = None,
        predicted: float | None = None,
    ) -> float | None:
        """Track a request; returns its break deadline on the guardian's clock (None: no budget).
        `predicted`: the end-to-end seconds its placement predicted, for rules written
        `elapsed >= N % of predicted` (without it those rules do not apply to the request)."""
        start = self._clock() if started is None else started
        with self._lock:
            found = self.table.budget_for(model, predicted)
            budget, seconds = found if found is not None else (None, 0.0)
            t = _Ticket(request_id, model, start, stream, gpu_key, backend, on_redirect, retry_count, budget, seconds)
            if request_id in self._tickets:
                raise ValueError(f"request `{request_id}` is already tracked")
            self._tickets[request_id] = t
            if budget is None:
                return None
            rb = self._budget_of(budget.breaker)
            rb.request_started()
            if retry_count > 0 and self._pending_slots.pop(request_id, None) is not None:
                t.holds_retry_slot = True
            deadline = start + seconds
            t.token = self._watch.arm(deadline, functools.partial(self._crossed_late, request_id, t),
                                      functools.partial(self._cancel_at, t)
                                      if any(a.kind == CANCEL_STREAM for a in budget.breaker.actions) else None)
            return deadline

    def finish(self, request_id: str) -> None:
        """The request ended (answered, failed or cancelled by someone else)."""
        with self._lock:
            t = self._tickets.pop(request_id, None)
            if t is None or t.budget is None:
                return
            self._watch.disarm(t.token)
            rb = self._budget_of(t.budget.breaker)
            rb.request_finished()
            if t.holds_retry_slot:
                rb.release()

    def active(self) -> int:
        return len(self._tickets)

    def _crossed_late(self, request_id: str, t: _Ticket, lateness: float) -> None:
        self._crossed(request_id, lateness, t)

    def _cancel_at(self, t: _Ticket, lateness: float) -> None:
        self._cancel_now(t, lateness)

    def _cancel_now(self, t: _Ticket, lateness: float) -> None:
        """The stream's cancel, at the crossing itself (the budget watch's urgent step, ahead
        of every account); `_crossed` records it."""
        crossed_at = self._clock() - lateness
        try:
            t.stream.cancel()
            err: Exception | None = None
        except Exception as exc:  # a stream that is already gone cannot be cancelled: recorded as failed
            err = exc
        t.cancelled = (err, self._clock() - crossed_at)

    def _crossed(self, request_id: str, lateness: float, ticket: _Ticket | None = None) -> None:
        """The break's account and its other acts (`ticket`: the request's, kept from arming:
        a stream cancelled at the crossing may have been finished by its owner since). A
        quarantine is deferred to the budget watch's next moment free of crossings: its map
        update, audit and socket walk would otherwise hold the interpreter as a later
        crossing of the burst wants it."""
        crossed_at = self._clock() - lateness
        with self._lock:
            t = self._tickets.get(request_id, ticket)
        if t is None or t.budget is None:
            return
        rule = t.budget.breaker
        acc = _Crossing(request_id, crossed_at, self._clock() - t.started)
        at = self._at_crossing
        for action in rule.actions:
            act = at.get(action.kind)
            if act is not None:
                act(t, rule, action, acc)
        quarantine, cancel_s = acc.quarantine, acc.cancel_s
        if quarantine is not None:  # after the burst's cancels and accounts, between crossings (the budget watch's deferred work)
            self._watch.defer(functools.partial(self._quarantine_after_break, t, rule, quarantine, crossed_at, cancel_s))
        elif cancel_s is not None:
            self.break_timings.append(BreakTiming(cancel_s, None))
        with self._lock:
            if request_id in self._tickets:
                self._tickets[request_id].token = 0

    def _crossing_cancel(self, t: _Ticket, rule: Breaker, action: Any, acc: _Crossing) -> None:
        if t.cancelled is None:  # not cancelled at the crossing (no watch step ran): now
            self._cancel_now(t, self._clock() - acc.crossed_at)
        assert t.cancelled is not None
        err, acc.cancel_s = t.cancelled
        if err is None:
            outcome, detail = Outcome.DONE, f"budget {t.budget_s * 1e3:.1f} ms crossed at {acc.elapsed * 1e3:.1f} ms"
        else:
            outcome, detail = Outcome.FAILED, f"cancel failed: {err}"
        self._record(ActionKind.CANCEL_STREAM, f"request {acc.request_id}", rule.name, outcome, detail)

    def _crossing_redirect(self, t: _Ticket, rule: Breaker, action: Redirect, acc: _Crossing) -> None:
        self._redirect(t, rule, action)

    def _crossing_report(self, t: _Ticket, rule: Breaker, action: ReportAnomaly, acc: _Crossing) -> None:
        if t.gpu_key:
            self._anomalies.report_anomaly(t.gpu_key, ELAPSED, acc.elapsed)
            self._record(ActionKind.REPORT_ANOMALY, t.gpu_key, rule.name, Outcome.DONE, f"{ELAPSED}={acc.elapsed:.4f}s")
        else:
            self._record(ActionKind.REPORT_ANOMALY, f"request {acc.request_id}", rule.name, Outcome.REFUSED,
                         "request has no GPU to report")

    def _crossing_quarantine(self, t: _Ticket, rule: Breaker, action: Quarantine, acc: _Crossing) -> None:
        if t.backend is not None:
            acc.quarantine = action

    def _quarantine_after_break(self, t: _Ticket, rule: Breaker, action: Quarantine, crossed_at: float,
                                cancel_s: float | None) -> None:
        """A break's quarantine: the kernel map update, its audit record and the connections'
        end, deferred by the budget watch to a moment no crossing is near."""
        assert t.backend is not None
        self._quarantine(t.backend, rule, action)
        if cancel_s is not None:
            self.break_timings.append(BreakTiming(cancel_s, self._clock() - crossed_at))

    def _redirect(self, t: _Ticket, rule: Breaker, action: Redirect) -> None:
        target = f"request {t.request_id}"
        if t.retry_count >= 1:
            self._record(ActionKind.REDIRECT, target, rule.name, Outcome.REFUSED, "already a retry: never retried twice")
            return
        rb = self._budget_of(rule)
        if not rb.try_acquire():
            self._record(ActionKind.REDIRECT, target, rule.name, Outcome.REFUSED,
                         f"retry budget exhausted: {rb.retries_in_flight} retries in flight, {rb.allowed()} allowed")
            return
        headers = {k.lower(): v for k, v in action.headers}
        headers[RETRY_HEADER] = str(t.retry_count + 1)
        plan = RetryPlan(t.request_id, action.backup, action.variant, tuple(sorted(headers.items())), rule.name)
        self._record(ActionKind.REDIRECT, target, rule.name, Outcome.DONE,
                     f"to `{action.backup}` variant `{action.variant}` with {RETRY_HEADER}: {headers[RETRY_HEADER]}")
        if t.on_redirect is None:
            rb.release()
            return
        # The slot passes to the retry: `begin(request_id, ..., retry_count=1)` takes it over and
        # its `finish` gives it back.
        with self._lock:
            self._pending_slots[t.request_id] = rule.name
        t.on_redirect(plan)

    # ----------------------------------------------------------------- backends

    def backends(self) -> dict[Endpoint, Endpoint]:
        """Every registered backend and its quarantine target (its backup)."""
        with self._lock:
            return dict(self._backups)

    def backend_id(self, backend: Endpoint) -> int | None:
        """The id the kernel plane counts `backend`'s traffic under (None: not registered)."""
        with self._lock:
            return self._backend_ids.get(backend)

    def register_backend(self, backend: Endpoint, backup: Endpoint) -> None:
        with self._lock:
            backend_id = self._backend_ids.setdefault(backend, len(self._backend_ids) + 1)
            self._backups[backend] = backup
            self._book.add_backend(backend)
        self._plane.register_backend(backend, backend_id)

    def unregister_backend(self, backend: Endpoint) -> None:
        """The backend left the pool: no quarantine target, no share of the quarantine cap, no
        kernel counting. Its id stays reserved (a return counts on under the same id); a
        quarantine already in force runs out on its own."""
        with self._lock:
            self._backups.pop(backend, None)
            self._book.remove_backend(backend)
        self._plane.unregister_backend(backend)

    def observe_backend(self, backend: Endpoint, signals: Mapping[str, float]) -> tuple[str, ...]:
        """Feed one observation of a backend; returns the rules that fired."""
        fired: list[str] = []
        for rule in self.table.backend_rules:
            if not self._streak(rule, str(backend), all_hold(rule, signals)):
                continue
            fired.append(rule.name)
            for action in rule.actions:
                act = self._at_backend.get(action.kind)
                if act is not None:
                    act(backend, rule, action)
        return tuple(fired)

    def _backend_quarantine(self, backend: Endpoint, rule: Breaker, action: Quarantine) -> None:
        self._quarantine(backend, rule, action)

    def _backend_report(self, backend: Endpoint, rule: Breaker, action: ReportAnomaly) -> None:
        self._record(ActionKind.REPORT_ANOMALY, str(backend), rule.name, Outcome.OBSERVED, "backend anomaly")

    def _quarantine(self, backend: Endpoint, rule: Breaker, action: Quarantine) -> bool:
        now = self._clock()
        with self._lock:
            backup = self._backups.get(backend)
            decision = self._book.decide(backend, now, action.duration, action.max_duration, action.max_share)
            if backup is None:
                decision = type(decision)(False, 0.0, f"{backend} has no backup registered")
            if decision.allowed:
                self._book.record(backend, now, decision.duration, action.max_duration)
        if not decision.allowed:
            self._record(ActionKind.QUARANTINE, str(backend), rule.name, Outcome.REFUSED, decision.reason)
            return False
        assert backup is not None
        fenced = ""
        fence = self._executor.fence
        if fence is not None:  # replicas sharing a fleet: only the elected leader quarantines
            verdict = fence.admit(QUARANTINE, str(backend), f"to {backup} for {decision.duration:g} s", rule=rule.name,
                                  backup=str(backup), expires_at=time.time() + decision.duration)
            if not verdict.allowed:
                with self._lock:
                    self._book.released(backend)
                self._record(ActionKind.QUARANTINE, str(backend), rule.name, Outcome.REFUSED, verdict.detail)
                return False
            fenced = f" [fencing token {verdict.token}]"
        deadline_ns = time.monotonic_ns() + int(decision.duration * 1e9)
        self._plane.quarantine(backend, backup, self.table.ids.get(rule.name, 0), deadline_ns)
        self._record(ActionKind.QUARANTINE, str(backend), rule.name, Outcome.DONE, f"to {backup} for {decision.duration:g} s{fenced}")
        # Ending sockets walks the kernel's socket table: off the budget's threads, a burst in one walk.
        self._ender.submit(backend, rule.name)
        return True

    def _connections_ended(self, backend: Endpoint, rule: str, outcome: int | Exception) -> None:
        if isinstance(outcome, Exception):
            self._record(ActionKind.END_CONNECTIONS, str(backend), rule, Outcome.FAILED, str(outcome))
            return
        self._record(ActionKind.END_CONNECTIONS, str(backend), rule, Outcome.DONE, f"{outcome} connection(s) ended; clients reconnect")

    def tick(self) -> list[Endpoint]:
        """Release quarantines that have expired (the kernel already ignores them)."""
        now = self._clock()
        with self._lock:
            due = self._book.expired(now)
            for b in due:
                self._book.released(b)
        for b in due:
            self._plane.release(b)
            self._record(ActionKind.RELEASE, str(b), "", Outcome.DONE, "quarantine expired")
            self._end_redirected(b)
        return due

    def _end_redirected(self, backend: Endpoint) -> None:
        """The connections a quarantine sent to the backup would otherwise carry `backend`'s
        traffic there for as long as they live: the kernel plane ends them (by socket cookie)
        and the gateway connects to `backend` again."""
        end = getattr(self._plane, "end_redirected", None)
        if end is None:  # the user-space plane resolves each new connection itself
            return
        try:
            n = end(backend)
        except Exception as exc:  # recorded, never raised into the caller's tick
            self._record(ActionKind.END_CONNECTIONS, str(backend), "", Outcome.FAILED, f"ending redirected connections: {exc}")
            return
        self._record(ActionKind.END_CONNECTIONS, str(backend), "", Outcome.DONE,
                     f"{n} connection(s) redirected to its backup ended; new ones reach it again")

    # ----------------------------------------------------------------- GPUs

    def observe_gpu(self, gpu_key: str, signals: Mapping[str, float]) -> GpuVerdict:
        """One telemetry sample for a GPU, all layers merged (SM util, TLS time, gRPC errors...)."""
        all_rules = self.table.gpu_rules + self.table.request_rules + self.table.backend_rules + self.table.connection_rules
        cls = classify(all_rules, signals)
        fault_rules = [r for r in self.table.gpu_rules if r.classify in (None, MODEL_FAULT)]
        if cls is not None and not cls.blames_gpu:
            # Not the GPU's fault: its fault streaks restart, and the classifying rule's own
            # actions go to the audit log, never to the placer (the GPU's health stays).
            self._record(ActionKind.CLASSIFY, gpu_key, cls.rule, Outcome.OBSERVED,
                         f"cause {cls.cause}: " + ", ".join(f"{k}={v:g}" for k, v in cls.signals))
            with self._lock:
                for r in fault_rules:
                    self._streaks.counts.pop((r.name, gpu_key), None)
            rule = next(r for r in all_rules if r.name == cls.rule)
            fired_cls: tuple[str, ...] = ()
            if self._streak(rule, gpu_key, True):
                fired_cls = (rule.name,)
                self._record(ActionKind.REPORT_ANOMALY, gpu_key, rule.name, Outcome.OBSERVED,
                             f"{cls.cause} held {rule.consecutive} times in a row; GPU not blamed")
            return GpuVerdict(cls, fired_cls)
        fired: list[str] = []
        heal: list[StepResult] = []
        for rule in fault_rules:
            if not self._streak(rule, gpu_key, all_hold(rule, signals)):
                continue
            fired.append(rule.name)
            for action in rule.actions:
                act = self._at_gpu.get(action.kind)
                if act is not None:
                    act(gpu_key, rule, action, signals, heal)
        return GpuVerdict(cls, tuple(fired), tuple(heal))

    def _gpu_report(self, gpu_key: str, rule: Breaker, action: ReportAnomaly, signals: Mapping[str, float],
                    heal: list[StepResult]) -> None:
        sig = rule.conditions[0].signal
        value = signals.get(sig, float("nan"))
        self._anomalies.report_anomaly(gpu_key, sig, value)
        self._record(ActionKind.REPORT_ANOMALY, gpu_key, rule.name, Outcome.DONE, f"{sig}={value:g}")

    def _gpu_heal(self, gpu_key: str, rule: Breaker, action: SelfHeal, signals: Mapping[str, float],
                  heal: list[StepResult]) -> None:
        target = self._heal_targets.get(gpu_key) or HealTarget(gpu_key, gpu_key.split("/")[0])
        heal.extend(self._executor.run(action.steps, target, rule.name))

    def observe_gpus(self, keys: Sequence[str], signal: str, values: np.ndarray) -> list[tuple[str, GpuVerdict]]:
        """`observe_gpu(key, {signal: value})` for many GPUs reporting one signal (the decision
        service's SM utilisation of every busy GPU, each tick), at the cost of the few it can
        change. With one signal present, only rules whose every condition is on it can hold;
        a GPU whose value makes none of them hold and that has no streak running would change
        nothing (its streaks stay at 0, nothing is classified, nothing fires), so it is
        skipped: one comparison per condition over the array instead of ~7 µs of rule
        matching per GPU (1,200 busy GPUs of 2,048: 8.6 ms a tick). Returns the verdicts of
        the GPUs observed, in order."""
        values = np.asarray(values, dtype=np.float64)
        table = self.table
        live = np.zeros(len(values), dtype=bool)
        for rule in table.gpu_rules + table.request_rules + table.backend_rules + table.connection_rules:
            if all(c.signal == signal and c.of is None for c in rule.conditions):  # `of` needs a request (its SLO or prediction): never here
                hold = np.ones(len(values), dtype=bool)
                for c in rule.conditions:
                    hold &= COMPARE[c.cmp](values, c.value)
                live |= hold
        with self._lock:
            running = {key for _, key in self._streaks.counts}
        return [(key, self.observe_gpu(key, {signal: float(values[i])}))
                for i, (key, hit) in enumerate(zip(keys, live.tolist())) if hit or key in running]

    def adopt_quarantine(self, backend: Endpoint, backup: Endpoint, remaining_s: float, rule: str, why: str) -> bool:
        """A quarantine another replica's leader decided (replicas sharing a fleet): applied
        to this replica's plane for what is left of it, and audited here too. No fence: the
        act was the leader's, checked there; this only follows it. False when it is over or
        already in force here."""
        now = self._clock()
        with self._lock:
            if remaining_s <= 0 or backend in self._book.active(now):
                return False
            self._book.record(backend, now, remaining_s, remaining_s)
        self._plane.quarantine(backend, backup, self.table.ids.get(rule, 0), time.monotonic_ns() + int(remaining_s * 1e9))
        self._record(ActionKind.QUARANTINE, str(backend), rule, Outcome.DONE, f"to {backup} for {remaining_s:.3g} s ({why})")
        self._ender.submit(backend, rule)
        return True

    def set_fence(self, fence: Fence) -> None:
        """Replicas sharing a fleet: self-heal and quarantine pass `fence` (the elected
        leader's fencing token) before they act."""
        self._executor.fence = fence

    def set_heal_target(self, target: HealTarget) -> None:
        self._heal_targets[target.gpu_key] = target

    def _streak(self, rule: Breaker, key: str, holds: bool) -> bool:
        """Advance the rule's streak on `key`; True (and reset) when it reaches `consecutive`."""
        k = (rule.name, key)
        with self._lock:  # a streak at 0 has no entry: `observe_gpus` reads the keys as the running ones
            n = self._streaks.counts.get(k, 0) + 1 if holds else 0
            if n >= rule.consecutive or n == 0:
                self._streaks.counts.pop(k, None)
                return n > 0
            self._streaks.counts[k] = n
            return False

    # ----------------------------------------------------------------- misc

    def _record(self, kind: ActionKind, target: str, rule: str, outcome: Outcome, detail: str) -> None:
        self._audit(ActionRecord(time=time.time(), kind=kind, target=target, rule=rule, outcome=outcome,
                                 dry_run=outcome is Outcome.DRY_RUN, detail=detail,
                                 source="guardian" if self._plane.kernel_enforcement else "userspace"))

    @property
    def plane(self) -> EnforcementPlane:
        """The enforcement plane the guardian drives (kernel or user space)."""
        return self._plane

    @property
    def executor(self) -> ActionExecutor:
        """The self-heal executor (the gateway links its rebalance hook to its in-flight picks)."""
        return self._executor

    def close(self) -> None:
        self._watch.close()
        self._ender.close()
