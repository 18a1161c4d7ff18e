"""Adapters from the decision service and the enforcer to the audit log's record schemas.

`AuditBridge` is also the gate in front of every acknowledged decision (`refusal()`): the
audit log fails closed. In group mode (the default) decisions are acknowledged at once and
made durable by group commit within FLUSH_AFTER plus one commit (WINDOW at most, or the
gate closes); in sync mode each answer waits for its record's commit. They go as drafts (`draft_of`: plain values, no pydantic): the audit log's writer process
validates, redacts and serialises them into the bytes `decision_record` would give, so
the decision thread pays a few microseconds instead of ~70 and keeps the interpreter lock
for decisions; the batch is handed over at once (`AuditLog.submit_decision_drafts`). `decision_record` stays for callers that want the validated record itself.
Enforcer action kinds map onto the audit schema's; kinds the schema has no name for
(classification, ending connections, kernel events) are kept as `report_anomaly`
observations with the original kind in the detail, never dropped.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import Any, Callable, Mapping, TypeVar

import msgspec

from policyc.audit.accounting import estimate_resources, estimated_figures
from policyc.audit.draft_encoder import DecisionWire, LatencyWire, OriginWire, PlacementWire, RejectingWire, ResourcesWire, RuleWire
from policyc.audit.drafts import DecisionDraft, FigureFields, decision_draft
from policyc.audit.errors import AuditWriteError
from policyc.audit.schemas import DECISION_SCHEMA
from policyc.audit.log import AuditLog
from policyc.audit.records import ActionRecord as AuditAction
from policyc.audit.records import DecisionRecord, Latency, MatchedRule, Placement, RejectingRule
from policyc.compiler.bundle import Bundle
from policyc.enforcer.records import ActionKind, ActionRecord, Outcome
from policyc.matcher import AppliedRule

from .config import AuditDurability
from .convert import render_var
from .decision import Decision, Outcome as DecisionOutcome
from .rejected_by import rejected_by

log = logging.getLogger("policyc.server")

_OUTCOMES = {Outcome.DONE: "done", Outcome.DRY_RUN: "dry_run", Outcome.FAILED: "failed",
             Outcome.REFUSED: "skipped", Outcome.OBSERVED: "done"}
_KINDS = {ActionKind.CANCEL_STREAM: "cancel_stream", ActionKind.REDIRECT: "redirect",
          ActionKind.REPORT_ANOMALY: "report_anomaly", ActionKind.QUARANTINE: "quarantine",
          ActionKind.RELEASE: "release"}
_STEPS = ("gpu_reset", "rdma_link_refresh", "rebalance")
_OUTCOME_TEXT = {o: o.value for o in DecisionOutcome}  # plain str, as the draft schema wants
_FIGURES_MAX = 4096
# (bundle hash, model, GPU class, share) -> `estimated_figures`: shares come from a few
# (contract, GPU class, latency target) combinations, so a decision almost always finds
# its figures here (~7 µs saved). Entries are shared by drafts: read them, never mutate.
_figures: dict[tuple[str, str, str, float], dict[str, FigureFields]] = {}


def _estimates(bundle: Bundle, model: str, gpu_model: str, share: float) -> dict[str, FigureFields] | None:
    key = (bundle.content_hash, model, gpu_model, share)
    got = _figures.get(key)
    if got is None:
        contract, gpu = bundle.contract(model), bundle.gpu(gpu_model)
        if contract is None or gpu is None or not 0 < share <= 1:
            return None
        if len(_figures) >= _FIGURES_MAX:
            _figures.clear()
        got = _figures[key] = estimated_figures(contract, gpu, share)
    return got


def decision_record(d: Decision, headers: Mapping[str, str], bundle: Bundle) -> DecisionRecord:
    placement = resources = None
    if d.plan is not None:
        p = d.plan
        placement = Placement(instance=p.instance_id, host=p.host, gpu=p.gpu, gpu_model=p.gpu_model, region=d.region,
                              share=min(1.0, p.share) if p.share > 0 else None, predicted_latency=p.latency.total)
        contract = bundle.contract(d.model or "")
        gpu = bundle.gpu(p.gpu_model)
        if contract is not None and gpu is not None and 0 < p.share <= 1:
            resources = estimate_resources(contract, gpu, p.share)
    extra: dict[str, object] = {"resources": resources} if resources is not None else {}
    refusing = rejected_by(d, bundle)
    if refusing is not None:
        extra["rejected_by"] = tuple(RejectingRule(stage=st, id=i, origin=o) for st, i, o in refusing)  # type: ignore[arg-type]
    return DecisionRecord(
        time=time.time(), decision_id=d.decision_id, tenant=d.tenant or "unknown", model=d.model,
        request=dict(headers), variables={k: (v if isinstance(v, (bool, float, str)) else render_var(v)) for k, v in d.variables.items()},
        bundle_hash=d.bundle_hash, outcome=d.outcome.value, reason=None if d.rejection is None else d.rejection.reason[:500],
        matched_rules=tuple(MatchedRule(id=r.id, origin=r.origin) for r in d.rules), placement=placement,
        latency=Latency(total=d.timing.total, stages=d.timing.stages()), **extra,  # type: ignore[arg-type]
    )


def draft_of(d: Decision, headers: Mapping[str, str], bundle: Bundle, now: float | None = None) -> DecisionDraft:
    """`decision_record` as plain values (same fields, same meaning), for
    `AuditLog.submit_decision_draft`; `now` defaults to the current time."""
    placement = resources = None
    if d.plan is not None:
        p = d.plan
        placement = {"instance": p.instance_id, "host": p.host, "gpu": p.gpu, "gpu_model": p.gpu_model, "region": d.region,
                     "share": min(1.0, p.share) if p.share > 0 else None, "predicted_latency": p.latency.total}
        resources = _estimates(bundle, d.model or "", p.gpu_model, p.share)
    return decision_draft(
        time=time.time() if now is None else now, decision_id=d.decision_id, tenant=d.tenant or "unknown", model=d.model,
        headers=headers,
        variables={k: (v if isinstance(v, (bool, float, str)) else render_var(v)) for k, v in d.variables.items()},
        bundle_hash=d.bundle_hash, outcome=_OUTCOME_TEXT[d.outcome], reason=None if d.rejection is None else d.rejection.reason[:500],
        matched_rules=[(r.id, r.origin.file, r.origin.line, r.origin.col, r.origin.end_line, r.origin.end_col) for r in d.rules],
        placement=placement,
        latency=d.timing.total, stages=d.timing.stages(), resources=resources,
        rejected_by=None if (refusing := rejected_by(d, bundle)) is None else
        [(st, i, None if o is None else (o.file, o.line, o.col, o.end_line, o.end_col)) for st, i, o in refusing],
    )


# A decision's matched rules are the matcher's own tuple, shared by every decision of the same
# shape, so they are memoised by that tuple's identity (the entry holds the tuple, so no other
# object can have its id while it is here): hashing it hashed each rule's pydantic origin,
# ~3 us a decision on the serving loop (profiled on the gateway benchmark).
_rules: dict[int, tuple[tuple[AppliedRule, ...], list[RuleWire]]] = {}
# The same for a decision's variables: the shape's own mapping (`Prepared.request.vars`, shared by every
# decision of the shape), rendered once per mapping (kept with it, so its id stays its own while here)
_variables: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}
_resources: dict[tuple[str, str, str, float], ResourcesWire] = {}
_NO_RESOURCES = ResourcesWire()
K = TypeVar("K")
V = TypeVar("V")


def _by_identity(memo: dict[int, tuple[K, V]], key: K, make: Callable[[K], V]) -> V:
    """`make(key)`, kept per object: every decision of a request shape shares its rules' tuple and
    its variables' mapping, so their wire forms are built once per shape. Keyed by `id` and
    checked by `is` (the object is kept alive with its entry, so its id is never reused while
    there); cleared whole at `_FIGURES_MAX` entries."""
    got = memo.get(id(key))
    if got is not None and got[0] is key:
        return got[1]
    if len(memo) >= _FIGURES_MAX:
        memo.clear()
    value = make(key)
    memo[id(key)] = (key, value)
    return value


def _rule_wires(applied: tuple[AppliedRule, ...]) -> list[RuleWire]:
    return [RuleWire(id=r.id, origin=OriginWire(file=r.origin.file, line=r.origin.line, col=r.origin.col,
                                                end_line=r.origin.end_line, end_col=r.origin.end_col)) for r in applied]


def _rendered(vs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (bool, float, str)) else render_var(v)) for k, v in vs.items()}


def wire_of(d: Decision, headers: Mapping[str, str], bundle: Bundle, now: float | None = None) -> DecisionWire:
    """`draft_of` built straight as the writer's struct (same fields, same stored bytes,
    tested), for `AuditLog.submit_decision_drafts`: the decision thread's whole audit cost,
    so its parts that repeat across decisions (the matched rules' list, the resource
    estimates) are built once and shared; the writer still validates every field. Shared
    parts are never mutated."""
    placement, resources = None, _NO_RESOURCES
    if d.plan is not None:
        p = d.plan
        placement = PlacementWire(instance=p.instance_id, host=p.host, gpu=p.gpu, gpu_model=p.gpu_model, region=d.region,
                                  share=min(1.0, p.share) if p.share > 0 else None, predicted_latency=p.latency.total)
        key = (bundle.content_hash, d.model or "", p.gpu_model, p.share)
        got = _resources.get(key)
        if got is None:
            figures = _estimates(bundle, d.model or "", p.gpu_model, p.share)
            if len(_resources) >= _FIGURES_MAX:
                _resources.clear()
            got = _resources[key] = msgspec.convert(figures or {}, ResourcesWire)
        resources = got
    rules = _by_identity(_rules, d.rules, _rule_wires)
    variables = _by_identity(_variables, d.variables, _rendered)
    t = d.timing
    refusing = rejected_by(d, bundle)
    return DecisionWire(
        schema_version=DECISION_SCHEMA, time=time.time() if now is None else now, decision_id=d.decision_id,  # type: ignore[arg-type]
        # the request's headers: the shape's own dict as it is (never mutated, as the other shared parts)
        tenant=d.tenant or "unknown", model=d.model, request=headers if type(headers) is dict else dict(headers),
        variables=variables,
        bundle_hash=d.bundle_hash, outcome=_OUTCOME_TEXT[d.outcome],  # type: ignore[arg-type]
        reason=None if d.rejection is None else d.rejection.reason[:500], matched_rules=rules,
        rejected_by=None if refusing is None else [
            RejectingWire(stage=st, id=i, origin=None if o is None else OriginWire(  # type: ignore[arg-type]
                file=o.file, line=o.line, col=o.col, end_line=o.end_line, end_col=o.end_col)) for st, i, o in refusing],
        placement=placement,
        latency=LatencyWire(total=t.total, stages={"parse": t.parse, "feasibility": t.feasibility, "match": t.match, "place": t.place}),
        resources=resources,
    )


def action_record(r: ActionRecord, bundle: Bundle | None = None) -> AuditAction:
    kind = _KINDS.get(r.kind)
    detail = r.detail
    target = r.target
    if r.kind is ActionKind.SELF_HEAL_STEP:
        step, _, rest = r.target.partition(" ")
        if step in _STEPS:
            kind, target = step, rest or r.target
    if kind is None:
        kind = "report_anomaly"
        detail = f"[{r.kind.value}] {detail}"
    origin = None
    if bundle is not None and r.rule:
        origin = next((b.origin for b in bundle.breakers if b.name == r.rule), None)
    return AuditAction(time=r.time, kind=kind, target=target, rule=r.rule or None, rule_origin=origin,  # type: ignore[arg-type]
                       outcome=_OUTCOMES[r.outcome], dry_run=r.dry_run, detail=f"{detail} (source: {r.source})")  # type: ignore[arg-type]


# Drafts handed to the log together: one hand-over becomes one commit (one fsync) in the
# writer, whose fixed cost (~450 µs CPU with synchronous=FULL, measured) is shared by the
# batch: 128 per hand-over cost the writer ~55 µs CPU per record where 32 cost ~75, and the
# decision process ~12 µs where 32 cost ~22 (same run, `benchmarks/RESULTS.md`, audit).
FLUSH_EVERY = 128
FLUSH_AFTER = 0.05  # seconds a draft may wait in the bridge for others (so at most ~50 ms at any rate)
# Group mode's window: a decision acknowledged before its record is durable must be durable
# within this many seconds, or the gate closes (Decide refuses) until the log catches up.
# So a crash of the server loses at most the decisions acknowledged in the last WINDOW
# seconds (typically FLUSH_AFTER plus one commit, ~50-60 ms); sync mode waits as long
# for a record before answering UNAVAILABLE.
WINDOW = 0.5
QUEUE_LIMIT = 2 << 20  # bytes queued for the writer beyond which the gate closes (the log blocks submitters at 4 MiB)


class AuditBridge:
    """Submits decisions (as drafts) and enforcer actions to an open `AuditLog`, and is the
    gate that stops Decide from acknowledging what the log cannot make durable.

    `refusal()` is the gate (None: admit; else the one-line reason, naming the audit log):
    the writer process is gone, a record could not be stored, the log is further behind
    than its window, or its queue is full. Every path that acknowledges a decision calls it
    first and then `record(decision, headers)`, which in sync mode returns a future to await
    before answering.

    Group mode: decision drafts are handed to the log in small batches (every `FLUSH_EVERY`
    decisions, or `FLUSH_AFTER` seconds after the oldest waiting one, whichever comes first;
    `flush` and `close` hand over the rest). One hand-over wakes the log's sender thread, and
    a thread that wakes asks the decision thread for the interpreter lock: per decision,
    that cost more than the draft itself (measured). Sync mode: the decisions of one turn of
    the event loop go over in one hand-over, and each answer waits for its batch's commit.
    """

    def __init__(self, log_: AuditLog, bundle: Bundle, *, durability: AuditDurability = AuditDurability.GROUP,
                 window: float = WINDOW) -> None:
        self.log = log_
        self.bundle = bundle
        self.durability = AuditDurability(durability)
        self.window = window
        self._refused_here = 0  # records refused before reaching the log
        self._acked_lost = 0  # of those, decisions already acknowledged (group mode)
        self._pending: list[tuple[str, DecisionWire]] = []
        self._oldest = 0.0
        # serialised per-call accounting records (`accounting`), handed over with the decisions
        self._bodies: list[bytes] = []
        self._bodies_since = 0.0
        self._closed = False
        self._lock = threading.Lock()
        # Hand-overs whose records are not all durable yet: (first ticket, end ticket, monotonic
        # time of the oldest decision in it, acknowledged already). Appended under `_lock`.
        self._handed: collections.deque[tuple[int, int, float, bool]] = collections.deque()
        self._handed_lost = 0  # acknowledged decisions of hand-overs found unstored
        self._pruning = threading.Lock()
        # sync mode: drafts of this loop turn, and (ticket, future, time) waiting for durability
        self._sync: list[tuple[DecisionWire, asyncio.Future[int], float]] = []
        self._waiting: collections.deque[tuple[int, asyncio.Future[int], float]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resolve_due = False
        self._watchers: list[Callable[[str | None], None]] = []
        self._state: str | None = None  # the last refusal watchers were told
        # Monotonic time before which the window cannot have run out (`refusal`'s O(1) answer):
        # the oldest undurable decision's time plus the window, as last found. Records only get
        # newer or leave, so it holds until then; 0 forces a full look.
        self._open_until = 0.0
        self._stop = threading.Event()
        log_.on_settled(self._on_settled)
        self._timer = threading.Thread(target=self._tick, name="audit-bridge-flush", daemon=True)
        self._timer.start()

    # ------------------------------------------------------------------ the gate

    @property
    def failures(self) -> int:
        """Records not stored: refused at the call here, or refused later by the writer
        process (a draft that does not validate; also logged by `policyc.audit`)."""
        return self._refused_here + self.log.failures

    @property
    def lost(self) -> int:
        """Records handed to the audit path that were never made durable (decisions and
        actions), including, once the writer is gone, everything it had not acknowledged."""
        return self._refused_here + self.log.lost

    @property
    def acknowledged_lost(self) -> int:
        """Decisions acknowledged to a client whose record was never made durable (group
        mode only: sync mode acknowledges nothing before it is durable)."""
        self._prune()
        return self._acked_lost + self._handed_lost + sum(self.log.unstored(f, e) for f, e, _, acked in list(self._handed) if acked)

    def refusal(self) -> str | None:
        """None while decisions may be acknowledged; else why not, in one line naming the
        audit log. The single gate of every path that acknowledges a decision (Decide, the
        gateway's picker): fail closed, never acknowledge what the log will not keep."""
        log = self.log
        # The fast answer, per decision: nothing failed, the queue has room and the window
        # cannot have run out yet (`_open_until`). The window part is O(1): the hand-overs
        # are pruned only when it may have run out.
        if (log.stopped is None and not log.failures and not self._refused_here and log.queued_bytes <= QUEUE_LIMIT
                and time.monotonic() < self._open_until):
            return None
        path = log.path
        stopped = log.stopped
        if stopped is not None:
            return f"audit log {path} is not accepting records ({stopped}); decisions are refused until the service is restarted"
        if log.failures or self._refused_here:
            return (f"audit log {path}: {self.failures} record(s) could not be stored; decisions are refused until the "
                    "service is restarted (see the `policyc.audit` log for why)")
        if log.queued_bytes > QUEUE_LIMIT:
            return f"audit log {path} is behind: {log.queued_bytes >> 10} KiB of records wait for its writer; decisions are refused until it catches up"
        now = time.monotonic()
        oldest = self._oldest_undurable()
        if oldest is not None and (age := now - oldest) > self.window:
            return (f"audit log {path} has not made a record durable for {age:.2f} s (window {self.window:g} s); "
                    "decisions are refused until it catches up")
        # open until the oldest waiting record (or one queued from now on) is a window old
        self._open_until = (now if oldest is None else oldest) + self.window
        return None

    def watch(self, fn: Callable[[str | None], None]) -> None:
        """Call `fn(refusal)` (from any thread) each time the gate opens or closes."""
        self._watchers.append(fn)

    def _prune(self) -> None:
        """Forget hand-overs whose records are all settled (counting any not stored). One
        thread at a time (the loop, the timer, the acknowledgement thread and a metrics
        scrape all call it); a thread that finds another pruning leaves it to that one."""
        if not self._pruning.acquire(blocking=False):
            return
        try:
            acked = self.log.acked
            handed = self._handed
            while handed and handed[0][1] <= acked:
                first, end, _, acknowledged = handed.popleft()
                if acknowledged:
                    self._handed_lost += self.log.unstored(first, end)
        finally:
            self._pruning.release()

    def _oldest_undurable(self) -> float | None:
        self._prune()
        oldest = self._oldest if self._pending else None
        try:
            t = self._handed[0][2]
            oldest = t if oldest is None else min(oldest, t)
        except IndexError:
            pass
        return oldest

    def _check_gate(self) -> None:
        state = self.refusal()
        if state == self._state:
            return
        self._state = state
        if state is not None and self.log.stopped != "closed":  # (a clean close is not news)
            log.error("%s", state)
        for fn in self._watchers:
            try:
                fn(state)
            except Exception:  # noqa: BLE001
                log.exception("audit: gate watcher failed")

    def _on_settled(self) -> None:
        """The log's acknowledgement thread: wake sync waiters; tell watchers at once when
        the writer is gone or a record was not stored."""
        if self._waiting and not self._resolve_due and self._loop is not None:
            self._resolve_due = True
            try:
                self._loop.call_soon_threadsafe(self._resolve)
            except RuntimeError:  # the loop is closed: nothing waits any more
                pass
        if (self.log.stopped is not None and self.log.stopped != "closed") or self.log.failures:
            self._check_gate()

    # ------------------------------------------------------------------ recording

    def record(self, d: Decision, headers: Mapping[str, str]) -> asyncio.Future[int] | None:
        """Record a decision about to be acknowledged (after `refusal()` said None). Group
        mode: queued, returns None. Sync mode: returns a future (of the running loop) that
        gives the record's seq once it is durable, or raises AuditWriteError; answer only
        after it. Call on the serving event loop."""
        if self.durability is AuditDurability.GROUP:
            self.decision(d, headers)
            return None
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        fut: asyncio.Future[int] = loop.create_future()
        try:
            draft = wire_of(d, headers, self.bundle)
        except Exception as e:  # not recorded: not acknowledged either
            fut.set_exception(AuditWriteError(f"audit log {self.log.path}: decision {d.decision_id} could not be recorded: {e}"))
            return fut
        self._sync.append((draft, fut, time.monotonic()))
        if len(self._sync) == 1:
            loop.call_soon(self._hand_over_sync)
        return fut

    def _hand_over_sync(self) -> None:
        """On the loop: this turn's decisions in one hand-over (one commit in the writer)."""
        batch, self._sync = self._sync, []
        if not batch:
            return
        try:
            first = self.log.submit_decision_drafts([draft for draft, _, _ in batch])
        except Exception as e:  # noqa: BLE001 - a stopped log: every waiter is refused
            err = e if isinstance(e, AuditWriteError) else AuditWriteError(f"audit log {self.log.path}: {e}")
            for _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(err)
            self._check_gate()
            return
        with self._lock:
            self._handed.append((first, first + len(batch), batch[0][2], False))
        self._waiting.extend((first + i, fut, t) for i, (_, fut, t) in enumerate(batch))
        if self.log.acked > first or self.log.stopped is not None:
            self._resolve()  # settled while we were handing over

    def _resolve(self, expire: bool = False) -> None:
        """On the loop: settle the futures whose tickets are acknowledged; with `expire`,
        refuse those that waited longer than the window."""
        self._resolve_due = False
        log_ = self.log
        waiting = self._waiting
        stopped = log_.stopped is not None
        while waiting and (waiting[0][0] < log_.acked or stopped):
            ticket, fut, _ = waiting.popleft()
            if fut.done():  # the caller gave up (deadline, cancelled)
                continue
            try:
                fut.set_result(log_.settled(ticket))
            except AuditWriteError as e:
                fut.set_exception(e)
        if expire:
            now = time.monotonic()
            for _ticket, fut, t in waiting:
                if now - t > self.window and not fut.done():
                    fut.set_exception(AuditWriteError(
                        f"audit log {log_.path}: decision record not durable within {self.window:g} s; the decision is not acknowledged"))

    def decision(self, d: Decision, headers: Mapping[str, str]) -> None:
        """Queue a decision's record without waiting (group mode's acknowledgement)."""
        try:
            draft = wire_of(d, headers, self.bundle)
        except Exception as e:  # the audit log must not take the decision path down; count and say so
            self._refused_here += 1
            self._acked_lost += 1
            log.error("audit: decision %s not recorded: %s", d.decision_id, e)
            return
        now = time.monotonic()
        with self._lock:
            pending = self._pending
            pending.append((d.decision_id, draft))
            if len(pending) == 1:
                self._oldest = now
            elif len(pending) >= FLUSH_EVERY or now - self._oldest >= FLUSH_AFTER:
                self._hand_over()

    def flush(self) -> None:
        """Hand every waiting draft to the log now (they are then queued, not yet durable)."""
        with self._lock:
            self._hand_over()

    def _hand_over(self) -> None:  # with self._lock held, so batches reach the log in order
        batch, self._pending = self._pending, []
        bodies, self._bodies = self._bodies, []
        if not batch and not bodies:
            return
        try:
            first = self.log.submit_decision_drafts([draft for _, draft in batch], bodies)
            if batch:
                self._handed.append((first, first + len(batch), self._oldest, True))
            return
        except TypeError:
            pass  # a draft with a value that is not a plain one: one by one, so only it is refused
        except Exception as e:  # a closed or stopped log: count and say so, never raise into Decide
            self._refused_here += len(batch) + len(bodies)
            self._acked_lost += len(batch)
            log.error("audit: %d decision(s) and %d accounting record(s) not recorded (%s ...): %s", len(batch), len(bodies),
                      batch[0][0] if batch else "accounting", e)
            return
        for decision_id, draft in batch:
            try:
                t = self.log.submit_decision_draft(draft)._ticket
                self._handed.append((t, t + 1, self._oldest, True))
            except Exception as e:
                self._refused_here += 1
                self._acked_lost += 1
                log.error("audit: decision %s not recorded: %s", decision_id, e)
        if bodies:
            try:
                self.log.submit_bodies(bodies)
            except Exception as e:
                self._refused_here += len(bodies)
                log.error("audit: %d accounting record(s) not recorded: %s", len(bodies), e)

    def accounting(self, record: AuditAction) -> None:
        """Queue a call's measured `accounting` record (the gateway's access-log receiver
        hands `accounting_body` its stored bytes instead) to be handed over with the next
        batch of decisions: the writer stores both in
        one commit, where a record handed over on its own arrival (every access-log flush)
        cost a commit (an fsync) of its own (measured). Same stored bytes as
        `AuditLog.submit_action`; it reaches the log within ~FLUSH_AFTER like a decision.
        Raises AuditWriteError, as `submit_action` does, once the log or this bridge is
        closed or the writer is gone (the receiver counts the record dropped)."""
        if not isinstance(record, AuditAction):
            raise TypeError(f"accounting takes an audit ActionRecord, not {type(record).__name__}")
        self._queue_body(record.model_dump_json(exclude_none=True).encode(), record.decision_id)

    def accounting_body(self, body: bytes) -> None:
        """`accounting` for a record already serialised (`gateway.access_log.accounting_body`,
        `audit.accounting.call_accounting_body`: the same bytes, built without pydantic on the
        serving loop, which makes one per call). Stored as given, as `AuditLog.submit_body` does."""
        if not isinstance(body, bytes):
            raise TypeError(f"accounting_body takes a record's stored body (bytes), not {type(body).__name__}")
        self._queue_body(body, None)

    def _queue_body(self, body: bytes, decision_id: str | None) -> None:
        stopped = self.log.stopped
        with self._lock:
            if self._closed or stopped is not None:
                raise AuditWriteError(f"{self.log.path}: audit log is {stopped or 'closed'}; accounting record"
                                      f"{f' of {decision_id}' if decision_id else ''} not recorded")
            bodies = self._bodies
            bodies.append(body)
            if len(bodies) == 1:
                self._bodies_since = time.monotonic()
            elif len(bodies) >= FLUSH_EVERY:
                self._hand_over()

    def _tick(self) -> None:
        """Background: a quiet service's last decisions reach the log within ~FLUSH_AFTER;
        the gate is re-evaluated (watchers told of a change) and sync waiters past the
        window are refused."""
        while not self._stop.wait(FLUSH_AFTER / 2):
            now = time.monotonic()
            if (self._pending and now - self._oldest >= FLUSH_AFTER) or (self._bodies and now - self._bodies_since >= FLUSH_AFTER):
                self.flush()
            self._check_gate()
            if self._waiting and self._loop is not None and self._state is not None:
                try:
                    self._loop.call_soon_threadsafe(self._resolve, True)
                except RuntimeError:
                    pass

    def action(self, r: ActionRecord) -> None:
        try:
            self.log.submit_action(action_record(r, self.bundle))
        except Exception as e:
            self._refused_here += 1
            log.error("audit: action %s on %s not recorded: %s", r.kind.value, r.target, e)

    def bundle_reload(self, accepted: bool, source: str, detail: str) -> None:
        """A bundle reload (ReloadBundle, SIGHUP), accepted or refused, as an action of the
        system's own (no breaker): kind `bundle_reload` on target `bundle`, outcome done
        (accepted) or skipped (refused), the detail saying what happened."""
        verdict = "accepted" if accepted else "refused"
        try:
            self.log.submit_action(AuditAction(
                time=time.time(), kind="bundle_reload", target="bundle", outcome="done" if accepted else "skipped",
                dry_run=False, detail=f"bundle reload {verdict} ({source}): {detail[:2000]}"))
        except Exception as e:
            self._refused_here += 1
            log.error("audit: bundle reload (%s, %s) not recorded: %s", verdict, source, e)

    def close(self) -> None:
        self._stop.set()
        self._timer.join()
        with self._lock:
            self._closed = True  # later accounting records are refused (counted), never left unsent
            self._hand_over()
        self.log.close()
