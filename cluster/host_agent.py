"""`policyc agent run`: one per host. It announces itself and what it discovered of its
host (interfaces and addresses, `host_facts.py`; rediscovered every few seconds) under its
lease (`agents/<host>`), publishes what it measures on its host every tick (`signals/<host>`,
under the same lease: `host_signals.py` reads the kernel, `signal_ticker.py` keeps the period,
optionally SCHED_FIFO and pinned, and measures its own period, jitter and CPU), answers the control plane's attestation challenges for its host with
its TPM's quotes (`attestation.py` has the exchange), and keeps the instances of its own
host registered through `InstanceAgent` (the model server's lease), refusing any instance
that claims another host. It starts and supervises the host's model servers
(`server_supervisor.py`), each pinned to the NUMA node and CPUs its placement plan names
(`server_pinning.py`), restarts one that crashes, and measures each under its name.

    agent = HostAgent(store, keys, "host-3", HostTpm(tcti, state_dir))
    await agent.start()      # answers every challenge until stop()
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from policyc.matcher import Instance

from .agent import InstanceAgent
from .host_acts import ActTaker
from .host_signals import Collector
from .attestation import check_host, encode_answer, qualifying_data
from .host_claims import fill
from .host_facts import HostFacts, discover, uplinks
from .host_hardware import Site
from .keys import Keys
from .lease_keeper import LeaseKeeper
from pathlib import Path
from typing import Sequence
from .server_supervisor import ServerSpec, ServerSupervisor
from .signed_reports import ReportKey
from .session_probe import SessionProbe, SessionStore
from .signal_ticker import Ticker
from .store import ChangeKind, Compacted, FleetStore, StoreError, StoreUnavailable
from .tpm import HostTpm, TpmError
from .tpm_quote import AttestationKey, parse_selection

log = logging.getLogger("policyc.agent")
MAX_CHALLENGE_AGE = 60.0  # seconds: an older challenge found at start is not answered


class HostAgent:
    def __init__(self, store: FleetStore, keys: Keys, host: str, tpm: HostTpm | None, *, ttl: int = 5,
                 discover_facts: bool = True, facts_interval: float = 5.0, signal_period: float | None = 0.2,
                 sched_fifo: int | None = None, cpus: tuple[int, ...] | None = None,
                 processes: dict[str, int] | None = None, servers: Sequence[ServerSpec] = (),
                 server_log_dir: Path | None = None, session_stores: Sequence[SessionStore] = (),
                 session_interval: float = 1.0, uplinks: Sequence[str] | None = None, site: Site | None = None,
                 hardware_facts: bool = True, sys_root: str = "/sys") -> None:
        self.store, self.keys, self.host, self.tpm = store, keys, check_host(host), tpm
        self.ak_name = ""
        self.report_key = ReportKey() if tpm is not None else None  # signs its signal reports (bound by its quotes)
        self.discover_facts, self.facts_interval = discover_facts, facts_interval
        self.site, self.hardware_facts, self._sys_root = site or Site(), hardware_facts, sys_root
        self.facts: HostFacts | None = None
        self._rediscover: asyncio.Task[None] | None = None
        self.answered = 0  # challenges answered (for status and tests)
        self._keeper = LeaseKeeper(store, ttl, self._announce, f"agent {host}")
        self._task: asyncio.Task[None] | None = None
        self._instances: list[InstanceAgent] = []
        self._uplinks = uplinks
        self.sessions = SessionProbe(session_stores, interval=session_interval) if session_stores else None
        self.ticker = (Ticker(Collector(processes, sessions=self.sessions), signal_period, self._take, sched_fifo=sched_fifo, cpus=cpus)
                       if signal_period is not None else None)
        self._pending: dict[str, object] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._publisher: asyncio.Task[None] | None = None
        self.published = 0  # signal reports written (for status and tests)
        self._served: dict[str, InstanceAgent] = {}  # supervised server -> its registration while it runs
        self._specs = {s.name: s for s in servers}
        self.supervisor = (ServerSupervisor(servers, on_pid=self._server_started, on_exit=self._server_exited,
                                            log_dir=server_log_dir)
                           if servers else None)
        self.acts = ActTaker(store, keys, self.host, lambda: self._keeper.lease, self._drain,
                             self.supervisor.restart if self.supervisor is not None else None)
        self.acts.supervised = lambda: {s.name for s in servers}
        self._acting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.tpm is not None:
            ak = await asyncio.to_thread(self.tpm.attestation_key)
            self.ak_name = AttestationKey.parse(ak).name.hex()
        if self.discover_facts:
            self.facts = await asyncio.to_thread(self._discover_all)
        if self.ticker is not None:  # which interfaces are its uplinks: the operator's, else the routes' (`host_facts.uplinks`)
            if self._uplinks is not None:
                self.ticker.collector.uplinks = frozenset(self._uplinks)
            elif self.facts is not None:
                self.ticker.collector.uplinks = await asyncio.to_thread(uplinks, self.facts)
        if self.sessions is not None:  # ValueError: a store directory that is not there
            self.sessions.start()
        for spec in self._specs.values():  # an instance of another host, or one its facts contradict: refused first
            if spec.instance is not None and spec.instance.deployment.host != self.host:
                raise ValueError(f"model server {spec.name}: instance `{spec.instance.id}` claims host "
                                 f"`{spec.instance.deployment.host}`; this agent is `{self.host}`'s")
            if spec.instance is not None:
                self._with_host_facts(spec.instance, f"model server {spec.name}")
        self._loop = asyncio.get_running_loop()
        try:
            if self.supervisor is not None:  # PinError: a plan this host cannot honour, before anything is announced
                await self.supervisor.start()
            try:
                await self._keeper.start()
            except BaseException:
                if self.supervisor is not None:  # no agent, no servers left behind
                    await self.supervisor.stop()
                raise
        except BaseException:
            if self.sessions is not None:
                self.sessions.stop()
            raise
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._answering())
        self._acting = loop.create_task(self.acts.run())
        if self.discover_facts:
            self._rediscover = loop.create_task(self._rediscovering())
        if self.ticker is not None:
            self._wake, self._loop = asyncio.Event(), loop
            self._publisher = loop.create_task(self._publishing())
            try:
                await asyncio.to_thread(self.ticker.start)  # IsolationError: the flags could not be applied
            except BaseException:  # what started above stops, and the host's lease is revoked: no half agent left
                await self.stop()
                raise

    async def stop(self) -> None:
        if self.ticker is not None:
            await asyncio.to_thread(self.ticker.stop)
        if self.sessions is not None:
            await asyncio.to_thread(self.sessions.stop)
        for t in (self._task, self._rediscover, self._publisher, self._acting):
            if t is not None:
                t.cancel()
        for a in self._instances:
            await a.stop()
        if self.supervisor is not None:
            await self.supervisor.stop()
        for a in list(self._served.values()):
            await a.stop()
        self._served.clear()
        await self._keeper.stop(revoke=True)

    def _discover_all(self) -> HostFacts:
        """Interfaces, and (unless off) the hardware and site facts; a TPM the agent was given
        (`--tcti`) is a TPM of this host whether or not it shows under /dev."""
        facts = discover(self.host, self.site, hardware=self.hardware_facts, sys_root=self._sys_root)
        if self.report_key is not None:
            import dataclasses

            facts = dataclasses.replace(facts, report_key=self.report_key.public_hex)
        hw = facts.hardware
        if hw is not None and self.tpm is not None and "tpm" not in hw.security:
            import dataclasses

            hw = dataclasses.replace(hw, security=tuple(sorted((*hw.security, "tpm"))),
                                     sources={**hw.sources, "security.tpm": f"the agent's TPM (--tcti {self.tpm.tcti})"})
            facts = dataclasses.replace(facts, hardware=hw)
        return facts

    def _with_host_facts(self, instance: Instance, where: str) -> Instance:
        """`instance` with the facts its deployment leaves out taken from this host's (only
        fields it did not set: `host_claims.fill`); ValueError for a claim the host contradicts."""
        if self.facts is None or self.facts.hardware is None:
            return instance
        d = instance.deployment
        given = {k: getattr(d, k) for k in d.model_fields_set}
        filled = fill(given, self.facts, where)
        if filled == given:
            return instance
        return instance.model_copy(update={"deployment": d.model_copy(update={k: v for k, v in filled.items() if k not in given})})

    async def _announce(self, lease: int) -> None:
        await self.store.put(self.keys.agent(self.host), json.dumps(
            {"host": self.host, "ak_name": self.ak_name, "tpm": self.tpm is not None, "pid": os.getpid(),
             "time": time.time(), "facts": self.facts.to_json() if self.facts is not None else None}).encode(), lease)

    async def _rediscovering(self) -> None:
        """Publish the host's facts again when they change (an address added, a link down)."""
        while True:
            await asyncio.sleep(self.facts_interval)
            try:
                now = await asyncio.to_thread(discover, self.host)
                if self.facts is not None:  # the hardware does not change under a running agent: the network does
                    now = self.facts.with_interfaces(now)
                if now != self.facts:
                    self.facts = now
                    if self._keeper.lease:
                        await self._announce(self._keeper.lease)
            except (OSError, StoreError) as e:
                log.warning("agent %s: rediscovering its facts: %s", self.host, e)

    def _server_started(self, name: str, pid: int) -> None:
        """A supervised model server (re)started (from the supervisor's thread): measure the
        new process under its name, and register its instance (once the agent's lease is up)."""
        if self.ticker is not None:
            self.ticker.collector.processes[name] = pid
        spec = self._specs.get(name)
        if spec is not None and spec.instance is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._register_server(name)) if self._loop else None)

    def _server_exited(self, name: str, code: int) -> None:
        """A supervised model server exited unasked (on the loop): its instance goes until it is back."""
        a = self._served.pop(name, None)
        if a is not None:
            asyncio.get_running_loop().create_task(a.stop())

    async def _register_server(self, name: str) -> None:
        spec = self._specs[name]
        assert spec.instance is not None
        for _ in range(100):  # the agent's own lease first: at start, the servers start before it
            if self._keeper.lease:
                break
            await asyncio.sleep(0.05)
        old = self._served.pop(name, None)
        if old is not None:
            await old.stop()
        try:
            a = InstanceAgent(self.store, self._with_host_facts(spec.instance, f"model server {name}"), keys=self.keys)
            await a.start()
        except StoreError as e:
            log.warning("agent %s: registering model server %s: %s", self.host, name, e)
            return
        self._served[name] = a

    # ---------------------------------------------------------------- measured signals
    def _take(self, body: dict[str, object]) -> None:
        """From the collector's thread: the latest report, for the writer (one in flight at
        most; a newer report replaces one not yet written)."""
        def hand() -> None:
            self._pending = body
            if self._wake is not None:
                self._wake.set()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(hand)

    async def _publishing(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            body, self._pending = self._pending, None
            if body is None or not self._keeper.lease:
                continue
            body["host"] = self.host
            try:
                data = json.dumps(body, separators=(",", ":")).encode()
                if self.report_key is not None:  # an enrolled host's reports are merged only signed (`signed_reports.py`)
                    data = self.report_key.sign(data)
                await self.store.put(self.keys.signal(self.host), data, self._keeper.lease)
                self.published += 1
            except StoreError as e:
                log.info("agent %s: publishing its signals: %s", self.host, e)

    # ---------------------------------------------------------------- challenges
    async def _answering(self) -> None:
        prefix = self.keys.challenges(self.host)
        revision = 0
        while True:
            try:
                if not revision:  # start, or after a compaction: the challenges open now
                    snap = await self.store.read_prefix(prefix)
                    revision = snap.revision
                    for e in snap.entries:
                        await self._answer(e.key[len(prefix):], e.value, fresh_only=True)
                async for ch in self.store.watch(prefix, revision + 1):
                    revision = max(revision, ch.revision)
                    if ch.kind is ChangeKind.PUT:
                        await self._answer(ch.key[len(prefix):], ch.value)
            except Compacted:
                revision = 0
            except StoreUnavailable as e:
                log.info("agent %s: watch interrupted (%s); resuming", self.host, e)
                await asyncio.sleep(0.2)
            except StoreError as e:
                log.warning("agent %s: %s", self.host, e)
                await asyncio.sleep(0.5)

    async def _answer(self, tag: str, raw: bytes, *, fresh_only: bool = False) -> None:
        try:
            body = json.loads(raw)
            nonce, pcrs = bytes.fromhex(str(body["nonce"])), parse_selection(str(body["pcrs"]))
            lease = int(body.get("lease") or 0)
            if not 8 <= len(nonce) <= 64:
                raise ValueError(f"a nonce of {len(nonce)} bytes (8-64 expected)")
            if tag != nonce[:16].hex():
                raise ValueError(f"challenge `{tag[:40]}` does not name its nonce")
            if fresh_only and time.time() - float(body.get("time", 0)) > MAX_CHALLENGE_AGE:
                return
        except (ValueError, KeyError, TypeError) as e:
            log.warning("agent %s: not a challenge (%s); ignored", self.host, e)
            return
        if self.tpm is None:
            log.warning("agent %s: challenged, but this agent has no TPM (--tcti); not answered", self.host)
            return
        facts = self.facts.to_json() if self.facts is not None else None
        try:  # the quote signs the nonce together with the facts it is sent with
            quote = await asyncio.to_thread(self.tpm.quote, qualifying_data(nonce, facts), pcrs)
        except TpmError as e:
            log.error("agent %s: could not quote: %s", self.host, e)
            return
        try:  # under the challenge's lease: the answer goes when the challenger is done
            await self.store.put(self.keys.quote_answer(self.host, tag), encode_answer(nonce.hex(), quote, facts), lease)
        except StoreError as e:
            log.warning("agent %s: the challenge from %s ended before its answer (%s)", self.host, body.get("by", "?"), e)
            return
        self.answered += 1
        log.info("agent %s: answered challenge from %s over %s", self.host, body.get("by", "?"), body["pcrs"])

    # ---------------------------------------------------------------- its host's instances
    async def _drain(self) -> int:
        """The leader's `drain` of this host: the instances this agent keeps, deregistered."""
        n = len(self._instances)
        for a in self._instances:
            await a.stop()
        self._instances.clear()
        return n

    async def keep_registered(self, instance: Instance, *, score: float | None = None, ttl: int = 5) -> InstanceAgent:
        """Register one of this host's instances under its own lease; ValueError for an
        instance that claims another host (an agent speaks for its own host only)."""
        if instance.deployment.host != self.host:
            raise ValueError(f"instance `{instance.id}` claims host `{instance.deployment.host}`; this agent is `{self.host}`'s")
        instance = self._with_host_facts(instance, f"instance `{instance.id}`")  # facts it leaves out: this host's
        a = InstanceAgent(self.store, instance, score=score, ttl=ttl, keys=self.keys)
        await a.start()
        self._instances.append(a)
        return a
