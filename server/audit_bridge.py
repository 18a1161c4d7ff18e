"""Adapters from the decision service and the enforcer to the audit log's record schemas.

Decisions are submitted without waiting (group commit makes them durable shortly after;
`AuditLog.close` flushes the rest), so auditing adds no fsync to a decision's latency.
They go as drafts (`draft_of`: plain values, no pydantic): the audit log's writer process
validates, redacts and serialises them into the bytes `decision_record` would give, so
the decision thread pays a few microseconds instead of ~70 and keeps the interpreter lock
for decisions; the batch is handed over at once (`AuditLog.submit_decision_drafts`). `decision_record` stays for callers that want the validated record itself.
Enforcer action kinds map onto the audit schema's; kinds the schema has no name for
(classification, ending connections, kernel events) are kept as `report_anomaly`
observations with the original kind in the detail, never dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping

import msgspec

from policyc.audit.accounting import estimate_resources, estimated_figures
from policyc.audit.draft_encoder import DecisionWire, LatencyWire, OriginWire, PlacementWire, ResourcesWire, RuleWire
from policyc.audit.drafts import DecisionDraft, FigureFields, decision_draft
from policyc.audit.schemas import DECISION_SCHEMA
from policyc.audit.log import AuditLog
from policyc.audit.records import ActionRecord as AuditAction
from policyc.audit.records import DecisionRecord, Latency, MatchedRule, Placement
from policyc.compiler.bundle import Bundle
from policyc.enforcer.records import ActionKind, ActionRecord, Outcome
from policyc.matcher import AppliedRule

from .convert import render_var
from .decision import Decision, Outcome as DecisionOutcome

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
    extra = {"resources": resources} if resources is not None else {}
    return DecisionRecord(
        time=time.time(), decision_id=d.decision_id, tenant=d.tenant or "unknown", model=d.model,
        request=dict(headers), variables={k: (v if isinstance(v, (bool, float, str)) else render_var(v)) for k, v in d.variables.items()},
        bundle_hash=d.bundle_hash, outcome=d.outcome.value, reason=None if d.rejection is None else d.rejection.reason[:500],
        matched_rules=tuple(MatchedRule(id=r.id, origin=r.origin) for r in d.rules), placement=placement,
        latency=Latency(total=d.timing.total, stages=d.timing.stages()), **extra,
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
        matched_rules=[(r.id, r.origin.file, r.origin.line, r.origin.col) for r in d.rules], placement=placement,
        latency=d.timing.total, stages=d.timing.stages(), resources=resources,
    )


_rules: dict[tuple[AppliedRule, ...], list[RuleWire]] = {}
_resources: dict[tuple[str, str, str, float], ResourcesWire] = {}
_NO_RESOURCES = ResourcesWire()


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
    rules = _rules.get(d.rules)
    if rules is None:
        if len(_rules) >= _FIGURES_MAX:
            _rules.clear()
        rules = _rules[d.rules] = [RuleWire(id=r.id, origin=OriginWire(file=r.origin.file, line=r.origin.line, col=r.origin.col)) for r in d.rules]
    t = d.timing
    return DecisionWire(
        schema_version=DECISION_SCHEMA, time=time.time() if now is None else now, decision_id=d.decision_id,
        tenant=d.tenant or "unknown", model=d.model, request=dict(headers),
        variables={k: (v if isinstance(v, (bool, float, str)) else render_var(v)) for k, v in d.variables.items()},
        bundle_hash=d.bundle_hash, outcome=_OUTCOME_TEXT[d.outcome], reason=None if d.rejection is None else d.rejection.reason[:500],
        matched_rules=rules, placement=placement,
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


class AuditBridge:
    """Submits decisions (as drafts) and enforcer actions to an open `AuditLog`.

    Decision drafts are handed to the log in small batches (every `FLUSH_EVERY` decisions,
    or `FLUSH_AFTER` seconds after the oldest waiting one, whichever comes first; `flush`
    and `close` hand over the rest). One hand-over wakes the log's sender thread, and a
    thread that wakes asks the decision thread for the interpreter lock: per decision, that
    cost more than the draft itself (measured). A batch waits at most 50 ms longer for
    durability than a single draft would, which a caller that does not wait never sees;
    a crash loses them as it loses drafts queued inside the log.
    """

    def __init__(self, log_: AuditLog, bundle: Bundle) -> None:
        self.log = log_
        self.bundle = bundle
        self._refused_here = 0
        self._pending: list[tuple[str, DecisionWire]] = []
        self._oldest = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._flush_old, name="audit-bridge-flush", daemon=True)
        self._timer.start()

    @property
    def failures(self) -> int:
        """Records not stored: refused at the call here, or refused later by the writer
        process (a draft that does not validate; also logged by `policyc.audit`)."""
        return self._refused_here + self.log.failures

    def decision(self, d: Decision, headers: Mapping[str, str]) -> None:
        try:
            draft = wire_of(d, headers, self.bundle)
        except Exception as e:  # the audit log must not take the decision path down; count and say so
            self._refused_here += 1
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
        if not batch:
            return
        try:
            self.log.submit_decision_drafts([draft for _, draft in batch])
            return
        except TypeError:
            pass  # a draft with a value that is not a plain one: one by one, so only it is refused
        except Exception as e:  # a closed or stopped log: count and say so, never raise into Decide
            self._refused_here += len(batch)
            log.error("audit: %d decision(s) not recorded (%s ...): %s", len(batch), batch[0][0], e)
            return
        for decision_id, draft in batch:
            try:
                self.log.submit_decision_draft(draft)
            except Exception as e:
                self._refused_here += 1
                log.error("audit: decision %s not recorded: %s", decision_id, e)

    def _flush_old(self) -> None:
        """Background: a quiet service's last decisions reach the log within ~FLUSH_AFTER."""
        while not self._stop.wait(FLUSH_AFTER / 2):
            if self._pending and time.monotonic() - self._oldest >= FLUSH_AFTER:
                self.flush()

    def action(self, r: ActionRecord) -> None:
        try:
            self.log.submit_action(action_record(r, self.bundle))
        except Exception as e:
            self._refused_here += 1
            log.error("audit: action %s on %s not recorded: %s", r.kind.value, r.target, e)

    def close(self) -> None:
        self._stop.set()
        self._timer.join()
        self.flush()
        self.log.close()
