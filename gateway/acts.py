"""What the gateway did to a request, told to the placer and the audit log.

Envoy breaks the stream (the per-try timeout resets it) and retries it on the backup; the
picker learns it from Envoy's access log (`policyc gateway`: the call's entry says 2
attempts, the answering one from another host than the one it chose; within a flush
interval, tens of ms) or, for an Envoy that sends policyc no access log, in the response
phase. Then, with the decision id in every record:
- `cancel_stream`: the upstream stream was reset at its budget (its connection stayed);
- `redirect`: the retry went to the backup with the redirect's headers and answered;
- `report_anomaly`: the chosen GPU's anomaly goes to the placer (`report_anomaly`, the
  guardian's sink), so its health drops on the next tick.
Records go straight to the audit log (the `decision_id` field is the call that caused
them) and are kept in memory, bounded, for the demo and tests.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from policyc.audit.records import ActionRecord
from policyc.compiler.actions import CANCEL_STREAM, REDIRECT, REPORT_ANOMALY
from policyc.compiler.bundle import Bundle
from policyc.enforcer.rule_table import ELAPSED

from .pick import Pick

log = logging.getLogger("policyc.gateway")
KEEP = 4096


class AnomalySink(Protocol):
    def report_anomaly(self, gpu: str, signal: str, value: float, /) -> object: ...


class ActionLog(Protocol):
    def submit_action(self, record: ActionRecord) -> object: ...


@dataclass(frozen=True, slots=True)
class Break:
    """One request Envoy broke and retried, as the access log (or the response phase) told it."""

    decision_id: str
    breaker: str
    primary: str  # endpoint chosen
    served: str  # endpoint that answered
    answered_by: str  # the instance id the answer names ("" when it did not say)
    attempt: int
    elapsed_s: float  # from the call's start (access log) or the picker's decision (response phase) to the answer's headers
    at_budget: bool  # the first attempt ran into its per-try timeout (else: reset by the upstream)
    lag_s: float | None = None  # from the break (the broken attempt's end) to the picker learning it; None: response phase


class Acts:
    def __init__(self, anomalies: AnomalySink | None, log_: ActionLog | None, bundle: Bundle) -> None:
        self.anomalies = anomalies
        self.log = log_
        self.bundle = bundle
        self.records: collections.deque[ActionRecord] = collections.deque(maxlen=KEEP)
        self.breaks: collections.deque[Break] = collections.deque(maxlen=KEEP)
        self.lost = 0

    def _record(self, kind: str, target: str, rule: str | None, detail: str, decision_id: str, outcome: str = "done") -> None:
        origin = next((b.origin for b in self.bundle.breakers if b.name == rule), None) if rule else None
        r = ActionRecord(time=time.time(), kind=kind, target=target, rule=rule, rule_origin=origin,  # type: ignore[arg-type]
                         outcome=outcome, dry_run=False, decision_id=decision_id,  # type: ignore[arg-type]
                         detail=f"{detail} (source: gateway)")
        self.records.append(r)
        if self.log is not None:
            try:
                self.log.submit_action(r)
            except Exception as e:  # noqa: BLE001 - counted and said; the answer is already on its way
                self.lost += 1
                log.error("audit: gateway action %s for decision %s not recorded: %s", kind, decision_id, e)

    def broken(self, pick: Pick, b: Break, variant: str) -> None:
        """Envoy broke `pick`'s first attempt and the retry answered: record each act."""
        rule = pick.breaker.name if pick.breaker is not None else None
        budget = f"{pick.per_try_timeout_ms} ms" if pick.per_try_timeout_ms is not None else "no budget"
        how = (f"at its per-try timeout ({budget}, predicted {pick.predicted_ms:.1f} ms)" if b.at_budget
               else f"after the upstream reset it (before its {budget} budget)")
        seen = (f"; seen in Envoy's access log {b.lag_s * 1e3:.0f} ms after the break" if b.lag_s is not None
                else "; seen in the answer's headers")
        self._record(CANCEL_STREAM, f"stream of request {pick.decision_id} to {pick.endpoint}", rule,
                     f"Envoy reset the upstream stream {how}: RST_STREAM on that stream only, its connection stays{seen}",
                     pick.decision_id)
        redirect = pick.redirect
        headers = ", ".join(f"{k}: {v}" for k, v in pick.retry_headers)
        self._record(REDIRECT, f"request {pick.decision_id}", rule,
                     f"retried on attempt {b.attempt} to `{redirect.backup if redirect else '?'}` at {b.served}"
                     f"{' (' + b.answered_by + ')' if b.answered_by else ''} with {headers or 'no headers'}; "
                     f"answered with the {variant or 'unnamed'} variant after {b.elapsed_s * 1e3:.1f} ms",
                     pick.decision_id)
        if pick.breaker is None or any(a.kind == REPORT_ANOMALY for a in pick.breaker.actions):
            if self.anomalies is not None:
                self.anomalies.report_anomaly(pick.gpu_key, ELAPSED, (pick.per_try_timeout_ms or 0) / 1e3)
                self._record(REPORT_ANOMALY, pick.gpu_key, rule,
                             f"{ELAPSED}={(pick.per_try_timeout_ms or 0) / 1e3:.4f}s on instance {pick.instance_id}: "
                             "its GPU's health drops on the placer's next tick", pick.decision_id)
            else:
                self._record(REPORT_ANOMALY, pick.gpu_key, rule, "no placer to report to", pick.decision_id, "skipped")
        self.breaks.append(b)

    def of(self, decision_id: str, at_least: int = 1, timeout: float = 0.0) -> list[ActionRecord]:
        """The acts recorded for `decision_id`, waiting up to `timeout` seconds for `at_least`
        of them: from the access log they come a flush interval after the answer. Call it
        from another thread than the server's loop (it sleeps)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in tuple(self.records) if r.decision_id == decision_id]
            if len(found) >= at_least or time.monotonic() >= deadline:
                return found
            time.sleep(0.005)
