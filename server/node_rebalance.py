"""Self-heal's "rebalance" of a node, step by step, each step an audit record:

1. release: the placer forgets the node's sessions and sticky placements (their next
   request is placed afresh);
2. cordon: the node's registered instances are deregistered, so nothing more is placed
   there (the gateway stops picking their endpoints within its pool sync);
3. drain: wait (bounded) until the calls in flight to their endpoints have answered (the
   sum over every in-flight source: the one given at construction and those a gateway
   links with `link_in_flight`, its picks whose requests have not ended);
4. re-register: each instance is registered again on a GPU of another host whose facts its
   contract admits and that holds no instance of that model yet; without one it stays off,
   and the record says so. The copy is a placement-only instance (no endpoint): the model
   server process of the cordoned node does not move by itself; a deployer starts it there.

In dry run (the default) only step 1 runs (it changes no registration) and steps 2-4 are
recorded as what would be done.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from policyc.enforcer.records import ActionKind, ActionRecord, Outcome
from policyc.matcher.instance import Instance, admission_problems
from policyc.placer import Placer
from policyc.placer.topology import GpuSlot

from .engine import DecisionEngine
from .errors import ServiceError

InFlight = Callable[[frozenset[str]], int]  # calls in flight to these endpoints now


class NodeRebalance:
    """The executor's rebalance hook (`ActionExecutor(rebalance=...)`)."""

    def __init__(self, engine: DecisionEngine, placer: Placer, audit: Callable[[ActionRecord], None],
                 slots: Callable[[], Sequence[GpuSlot]], *, execute: bool = False,
                 in_flight: InFlight | None = None, drain_timeout: float = 5.0) -> None:
        self.engine = engine
        self.placer = placer
        self.audit = audit
        self.slots = slots
        self.execute = execute
        self.in_flight = in_flight
        self.drain_timeout = drain_timeout
        self._sources: list[InFlight] = []  # linked gateways' in-flight picks

    def link_in_flight(self, source: InFlight) -> Callable[[], None]:
        """Count `source`'s calls in the drain (a gateway's in-flight picks); returns the unlink."""
        self._sources.append(source)
        return lambda: self._sources.remove(source) if source in self._sources else None

    def _in_flight(self, endpoints: frozenset[str]) -> int:
        own = [self.in_flight] if self.in_flight is not None else []
        return sum(src(endpoints) for src in own + list(self._sources))

    def _say(self, host: str, step: str, outcome: Outcome, detail: str) -> None:
        self.audit(ActionRecord(time=time.time(), kind=ActionKind.SELF_HEAL_STEP, target=f"rebalance {host}", rule="",
                                outcome=outcome, dry_run=outcome is Outcome.DRY_RUN, detail=f"{step}: {detail}",
                                source="executor"))

    def __call__(self, host: str) -> None:
        report = self.placer.rebalance(host)
        self._say(host, "release", Outcome.DONE,
                  f"{len(report.sessions_released)} session(s), {report.placements_released} sticky placement(s) released")
        on_node = [inst for inst, _, _ in self.engine.state.registry.entries() if inst.deployment.host == host]
        ids = ", ".join(i.id for i in on_node[:8]) + (" ..." if len(on_node) > 8 else "")
        if not self.execute:
            self._say(host, "cordon", Outcome.DRY_RUN, f"would deregister {len(on_node)} instance(s): {ids or 'none'}")
            self._say(host, "drain", Outcome.DRY_RUN, "would wait for their calls in flight")
            self._say(host, "re-register", Outcome.DRY_RUN, "would register them on other hosts their contracts admit")
            return
        for inst in on_node:
            try:
                self.engine.deregister(inst.id)
            except ServiceError:  # gone meanwhile
                pass
        self._say(host, "cordon", Outcome.DONE, f"deregistered {len(on_node)} instance(s): {ids or 'none'}")
        self._drain(host, frozenset(i.deployment.endpoint for i in on_node if i.deployment.endpoint))
        for inst in on_node:
            self._move(host, inst)

    def _drain(self, host: str, endpoints: frozenset[str]) -> None:
        if (self.in_flight is None and not self._sources) or not endpoints:
            self._say(host, "drain", Outcome.DONE, "no gateway endpoint on the node: nothing in flight to wait for")
            return
        t0 = time.monotonic()
        first = left = self._in_flight(endpoints)
        while left and time.monotonic() - t0 < self.drain_timeout:
            time.sleep(0.01)
            left = self._in_flight(endpoints)
        took = (time.monotonic() - t0) * 1e3
        if left:
            self._say(host, "drain", Outcome.FAILED, f"{left} of {first} call(s) still in flight after {took:.0f} ms")
        else:
            self._say(host, "drain", Outcome.DONE, f"{first} call(s) in flight answered within {took:.0f} ms")

    def _move(self, host: str, inst: Instance) -> None:
        bundle = self.engine.state.bundle
        taken = {(i.model, i.deployment.host, i.deployment.gpu) for i, _, _ in self.engine.state.registry.entries()}
        for slot in self.slots():
            if slot.host == host or (inst.model, slot.host, slot.gpu) in taken:
                continue
            moved = Instance(id=f"{inst.model}@{slot.host}/{slot.gpu}#from-{host}", model=inst.model, deployment=slot.to_deployment())
            if admission_problems(moved, bundle):
                continue
            try:
                self.engine.register(moved)
            except ServiceError as e:
                self._say(host, "re-register", Outcome.FAILED, f"{inst.id} on {slot.host}/{slot.gpu}: {e.message}")
                return
            self._say(host, "re-register", Outcome.DONE, f"{inst.id} registered as {moved.id} on {slot.host}/{slot.gpu}")
            return
        self._say(host, "re-register", Outcome.REFUSED, f"{inst.id}: no GPU on another host that its contract admits is free")
