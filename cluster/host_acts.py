"""Acts on the host they concern: the fenced leader's self-heal steps go to that host's
agent through etcd, carrying the leader's fencing token, and are carried out there.

- **Sending** (`ActSender`, on the leader): the executor's step for a host that has an agent
  becomes an order at `host_acts/<host>/<id>`, written in the same fenced transaction that
  records the act (`leadership.Election.fenced_now`: it lands only while the leader key
  still has that token), under the leader's lease. The executor records it as sent; the
  agent's result (`act_results/<host>/<id>`) is audited when it comes back, with the host,
  the fencing token, the outcome and the step's duration. Dry run stays the default: the
  order says whether to act, and a dry-run order is answered with what would be done.
- **Taking** (`ActTaker`, in `policyc agent run`): each order for its own host is checked
  against the leader key *now* (its create revision is the fencing token): an order from a
  deposed leader (a token that no longer leads) is refused and so answered. Then the step:
  `link_refresh` (down, up, carrier: `enforcer/heal_steps.refresh_link`, in the agent's own
  network namespace), `gpu_reset` (only where that GPU exists: `heal_steps.gpu_present`),
  `drain` (the agent deregisters the instances it keeps on its host) and `restart_server`
  (the model server the agent supervises under that name, stopped and started again pinned
  as before: `server_supervisor.py`; refused for a server it does not supervise).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from policyc.enforcer.heal_steps import HealStepError, gpu_present, refresh_link
from policyc.enforcer.records import ActionKind, ActionRecord, Outcome

from .keys import Keys
from .store import ChangeKind, Compacted, FleetStore, Put, StoreError, StoreUnavailable

if TYPE_CHECKING:
    from policyc.enforcer.executor import HealTarget, StepResult

    from .replica import Replica

log = logging.getLogger("policyc.agent")
STEPS = ("link_refresh", "gpu_reset", "drain", "restart_server")
EXECUTOR_STEPS = {"rdma_link_refresh": "link_refresh", "gpu_reset": "gpu_reset"}  # the executor's word -> the agent's
MAX_ORDER_AGE = 60.0  # seconds: an older order is not carried out (a replayed or long-delayed one)
_ids = itertools.count(1)


@dataclass(frozen=True)
class Order:
    id: str
    host: str
    step: str
    arg: str  # the interface, GPU index or server name
    dry_run: bool
    token: int
    leader: str
    rule: str
    time: float

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Order":
        try:
            b = json.loads(raw)
            o = cls(str(b["id"])[:80], str(b["host"])[:80], str(b["step"]), str(b["arg"])[:80], bool(b["dry_run"]),
                    int(b["token"]), str(b["leader"])[:80], str(b.get("rule", ""))[:120], float(b["time"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not an act order ({e})") from None
        if o.step not in STEPS:
            raise ValueError(f"unknown step `{o.step}` (known: {', '.join(STEPS)})")
        return o


# ================================================================ the leader's side
class ActSender:
    """The executor's hook (`ActionExecutor.remote`) on a replica: a host step for a host
    whose agent reports is sent there (see the module's docstring)."""

    def __init__(self, replica: "Replica", audit: Callable[[ActionRecord], None] | None = None) -> None:
        self.replica = replica
        self.audit = audit
        self.sent: dict[str, Order] = {}
        self.results: dict[str, dict[str, Any]] = {}  # act id -> the agent's answer, as audited
        self._lock = threading.Lock()

    def __call__(self, step: str, target: "HealTarget", rule: str, dry_run: bool) -> "StepResult | None":
        from policyc.enforcer.executor import StepResult

        host = target.node
        what = EXECUTOR_STEPS.get(step)
        if what is None or host not in self.replica.host_facts:
            return None  # not a host step, or no agent there: the executor's own way
        arg = target.rdma_link if what == "link_refresh" else target.gpu_index
        if what == "link_refresh" and not arg:
            return StepResult(step, Outcome.FAILED, f"no link known for {target.gpu_key}: nothing to send to {host}'s agent")
        election = self.replica.election
        act_id = f"{election.token:012d}-{os.getpid()}-{next(_ids)}"
        order = Order(act_id, host, what, arg, dry_run, election.token, self.replica.name, rule, time.time())
        put = Put(self.replica.keys.host_act(host, act_id), order.encode(), self.replica.keeper.lease)
        verdict = election.fenced_now("host_act", f"{what} {arg} on {host}", f"rule {rule}", [put], self.replica.cfg.op_timeout)
        if not verdict.allowed:
            return StepResult(step, Outcome.REFUSED, verdict.detail)
        with self._lock:
            self.sent[act_id] = order
        return StepResult(step, Outcome.OBSERVED,
                          f"sent to {host}'s agent ({what} {arg}{', dry run' if dry_run else ''}; act {act_id}) under "
                          f"fencing token {verdict.token}; its result is audited when it comes back")

    def on_result(self, key: str, raw: bytes) -> None:
        """An agent's answer (the replica's watch): audited with its host and token."""
        host, _, act_id = key.rpartition("/")
        host = host.rpartition("/")[2]
        try:
            b = json.loads(raw)
            outcome = Outcome(str(b["outcome"]))
            token, took, detail = int(b["token"]), float(b.get("duration_s", 0.0)), str(b.get("detail", ""))[:500]
            step, arg = str(b.get("step", "?")), str(b.get("arg", ""))
        except (KeyError, TypeError, ValueError) as e:
            log.warning("act result %s: not an answer (%s)", key, e)
            return
        with self._lock:
            if act_id in self.results:
                return
            mine = act_id in self.sent
            self.results[act_id] = {"host": host, "outcome": outcome.value, "token": token, "duration_s": took,
                                    "detail": detail, "step": step}
        if not mine or self.audit is None:
            return  # another replica's act: its own sender audits it
        self.audit(ActionRecord(time=time.time(), kind=ActionKind.SELF_HEAL_STEP, target=f"{step} {host}/{arg}",
                                rule=self.sent[act_id].rule, outcome=outcome, dry_run=outcome is Outcome.DRY_RUN,
                                detail=f"on host {host} by its agent under fencing token {token}, {took * 1e3:.0f} ms: {detail}",
                                source=f"agent {host}"))


# ================================================================ the agent's side
class ActTaker:
    """Watches its host's orders and carries them out (see the module's docstring)."""

    def __init__(self, store: FleetStore, keys: Keys, host: str, lease: Callable[[], int],
                 drain: Callable[[], Awaitable[int]] | None = None,
                 restart: Callable[[str], Awaitable[str]] | None = None) -> None:
        self.store, self.keys, self.host, self._lease, self._drain = store, keys, host, lease, drain
        self._restart = restart  # the supervisor's restart (None: the agent supervises no model server)
        self.supervised: Callable[[], set[str]] = lambda: set()
        self.done: list[dict[str, Any]] = []  # answers given (for status and tests)

    async def run(self) -> None:
        prefix = f"{self.keys.host_acts}{self.host}/"
        revision = 0
        while True:
            try:
                if not revision:
                    snap = await self.store.read_prefix(prefix)
                    revision = snap.revision
                    for e in snap.entries:
                        await self._take(e.key, e.value)
                async for ch in self.store.watch(prefix, revision + 1):
                    revision = max(revision, ch.revision)
                    if ch.kind is ChangeKind.PUT:
                        await self._take(ch.key, ch.value)
            except Compacted:
                revision = 0
            except StoreUnavailable:
                await asyncio.sleep(0.2)
            except StoreError as e:
                log.warning("agent %s: acts: %s", self.host, e)
                await asyncio.sleep(0.5)

    async def _take(self, key: str, raw: bytes) -> None:
        try:
            order = Order.decode(raw)
        except ValueError as e:
            log.warning("agent %s: %s: %s; ignored", self.host, key, e)
            return
        if order.host != self.host:
            log.warning("agent %s: an order for host %s under its key; ignored", self.host, order.host)
            return
        if time.time() - order.time > MAX_ORDER_AGE:
            outcome, detail, took = Outcome.REFUSED, f"the order is {time.time() - order.time:.0f} s old (at most {MAX_ORDER_AGE:g} s)", 0.0
        else:
            outcome, detail, took = await self._check_and_act(order)
        answer = {"id": order.id, "host": self.host, "step": order.step, "arg": order.arg, "outcome": outcome.value,
                  "detail": detail, "duration_s": took, "token": order.token, "leader": order.leader, "time": time.time()}
        self.done.append(answer)
        log.warning("agent %s: %s %s under fencing token %d: %s (%s)", self.host, order.step, order.arg, order.token,
                    outcome.value, detail)
        try:
            await self.store.put(self.keys.act_result(self.host, order.id), json.dumps(answer).encode(), self._lease())
            await self.store.delete(key)
        except StoreError as e:
            log.warning("agent %s: could not answer act %s: %s", self.host, order.id, e)

    async def _check_and_act(self, order: Order) -> tuple[Outcome, str, float]:
        leader = await self.store.get(self.keys.leader)
        if leader is None or leader.create_revision != order.token or leader.value.decode() != order.leader:
            now = f"{leader.value.decode()} leads under fencing token {leader.create_revision}" if leader else "no one leads"
            why = f"fencing token {order.token} of {order.leader} does not hold ({now}): a deposed leader's act, refused"
            return Outcome.REFUSED, why, 0.0
        t0 = time.monotonic()
        outcome, detail = await self._act(order)
        return outcome, detail, time.monotonic() - t0

    async def _act(self, o: Order) -> tuple[Outcome, str]:
        if o.step == "link_refresh":
            if o.dry_run:
                return Outcome.DRY_RUN, f"would take {o.arg} down and up in host {self.host}'s namespace and wait for carrier"
            try:
                r = await asyncio.to_thread(refresh_link, o.arg, None, carrier_timeout=10.0)
            except HealStepError as e:
                return Outcome.FAILED, str(e)
            return Outcome.DONE, f"{r.device} down {r.down_s * 1e3:.0f} ms, up, carrier after {r.carrier_after_s * 1e3:.0f} ms"
        if o.step == "gpu_reset":
            why = gpu_present(o.arg)
            if why is not None:
                return Outcome.REFUSED, why
            if o.dry_run:
                return Outcome.DRY_RUN, f"would run nvidia-smi --gpu-reset -i {o.arg}"
            try:
                out = await asyncio.to_thread(subprocess.run, ["nvidia-smi", "--gpu-reset", "-i", o.arg], capture_output=True,
                                              text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                return Outcome.FAILED, f"nvidia-smi: {e}"
            if out.returncode != 0:
                return Outcome.FAILED, f"nvidia-smi --gpu-reset -i {o.arg} exited {out.returncode}: {out.stderr.strip()[:200]}"
            return Outcome.DONE, f"nvidia-smi --gpu-reset -i {o.arg}"
        if o.step == "drain":
            if self._drain is None:
                return Outcome.FAILED, "this agent keeps no instances to drain"
            if o.dry_run:
                return Outcome.DRY_RUN, "would deregister the instances this agent keeps on its host"
            n = await self._drain()
            return Outcome.DONE, f"deregistered {n} instance(s) this agent kept on its host"
        if self._restart is None or o.arg not in self.supervised():
            return Outcome.REFUSED, f"restart of `{o.arg}`: this agent supervises no model server of that name"
        if o.dry_run:
            return Outcome.DRY_RUN, f"would stop model server {o.arg} and start it again, pinned as before"
        try:
            return Outcome.DONE, await self._restart(o.arg)
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            return Outcome.FAILED, f"restart of `{o.arg}`: {e}"


__all__ = ["ActSender", "ActTaker", "Order", "STEPS"]
