"""Self-heal started by a host agent's own report: when a host's agent measures one of its
links down (the interface's operstate, in its signal report every tick), the fenced leader
plans the heal for that host and sends it to that host's agent through the existing path
(`host_acts.ActSender`, the executor's remote: an order under the leader's fencing token,
carried out or, in dry run, answered with what would be done; the answer is audited with
the host and the token).

What counts as a link going down: an interface the same agent reported up earlier and now
reports down in `consecutive` reports in a row (an interface that was never up, such as a
spare `ifb0`, is not a failed link). One heal is planned per time the link goes down; if
it is still down `retry_s` later (a dry run leaves it down) it is planned again. Only the
replica that holds the fencing token plans; the others only watch.

The trigger is audited (`report_anomaly`, rule `agent-link-down`, from `replica <name>`)
before the steps, so the audit log reads: the agent's report, the leader's plan and send
(`executor`), and the agent's result (`agent <host>`), each naming the host and the token.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from policyc.enforcer.records import ActionKind, ActionRecord, Outcome

if TYPE_CHECKING:
    from .measured_hosts import HostReport
    from .replica import Replica

log = logging.getLogger("policyc.cluster")
RULE = "agent-link-down"
STEPS = ("rdma_link_refresh",)


@dataclass
class _Link:
    seen_up: bool = False
    down_reports: int = 0
    planned_at: float | None = None  # monotonic time of the last heal planned for this down episode


@dataclass
class LinkDownHealer:
    """Per replica: `on_report(host, report)` from its watch, for each signal report."""

    replica: "Replica"
    enabled: bool = True  # off: a down link is only measured (a benchmark timing another trigger's heal)
    consecutive: int = 2
    retry_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    planned: list[tuple[str, str, int]] = field(default_factory=list)  # (host, interface, token), for status and tests
    _links: dict[tuple[str, str], _Link] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_report(self, host: str, rep: "HostReport") -> None:
        """On the serving loop: cheap for every report (a comparison per interface); a heal
        to plan goes to a worker thread (its fenced send is a blocking store transaction)."""
        if not self.enabled:
            return
        due: list[str] = []
        now = self.clock()
        for name, v in rep.interfaces.items():
            if name == "lo" or "up" not in v:
                continue
            link = self._links.get((host, name))
            if link is None:
                link = self._links[(host, name)] = _Link()
            if v["up"] >= 0.5:
                link.seen_up, link.down_reports, link.planned_at = True, 0, None
                continue
            if not link.seen_up:
                continue  # never up as far as this replica saw: not a failed link
            link.down_reports += 1
            if link.down_reports < self.consecutive:
                continue
            if link.planned_at is not None and now - link.planned_at < self.retry_s:
                continue
            if not self.replica.election.token or self.replica.server.guardian is None:
                continue  # the leader plans; a replica without an enforcer has no executor
            if host not in self.replica.host_facts:
                continue  # no agent announced there to send it to (never run on this machine: the link is the host's)
            link.planned_at = now
            due.append(name)
        if due:
            loop = self.replica.loop
            assert loop is not None
            for name in due:
                loop.run_in_executor(None, self._plan, host, name, rep.time, rep.age())

    def forget(self, host: str) -> None:
        for key in [k for k in self._links if k[0] == host]:
            del self._links[key]

    def _plan(self, host: str, iface: str, measured_at: float, age: float) -> None:
        from policyc.enforcer.executor import HealTarget, StepResult

        g = self.replica.server.guardian
        if g is None:
            return
        executor = g.executor
        token = self.replica.election.token
        if not token:
            return
        detail = (f"host {host}'s agent measured {iface} down (operstate) in {self.consecutive} reports in a row, the last "
                  f"taken at {measured_at:.3f} ({age * 1e3:.0f} ms before it was read); leader {self.replica.name} plans "
                  f"{', '.join(STEPS)} of {host}/{iface} on {host}'s agent under fencing token {token}"
                  f"{'' if executor.allow_real else ' (dry run)'}")
        log.warning("replica %s: %s", self.replica.name, detail)
        executor.audit(ActionRecord(time=time.time(), kind=ActionKind.REPORT_ANOMALY, target=f"{host}/{iface}", rule=RULE,
                                    outcome=Outcome.OBSERVED, dry_run=not executor.allow_real, detail=detail,
                                    source=f"replica {self.replica.name}"))
        with self._lock:
            self.planned.append((host, iface, token))
        target = HealTarget(f"{host}/{iface}", host, rdma_link=iface)
        for step in STEPS:  # sent to the host's agent only (`ActSender`): never run on this machine, whose links are not the host's
            try:
                sent = self.replica.acts(step, target, RULE, not executor.allow_real)
            except Exception as e:  # noqa: BLE001 - a failed send is audited; never kill the worker
                sent = StepResult(step, Outcome.FAILED, f"sending it to {host}'s agent: {type(e).__name__}: {e}")
            if sent is None:
                sent = StepResult(step, Outcome.REFUSED, f"host {host} has no agent announced to carry it out; not run here")
            executor.audit(ActionRecord(time=time.time(), kind=ActionKind.SELF_HEAL_STEP, target=f"{step} {target.gpu_key}",
                                        rule=RULE, outcome=sent.outcome, dry_run=not executor.allow_real, detail=sent.detail,
                                        source="executor"))
            if sent.outcome in (Outcome.FAILED, Outcome.REFUSED):
                log.warning("replica %s: healing %s/%s: %s", self.replica.name, host, iface, sent.detail)
                break


__all__ = ["LinkDownHealer", "RULE"]
