"""One policyc replica's membership in its cluster.

A `Replica` runs beside a `DecisionServer`, on its event loop: the store client's calls
are awaited there, so a slow or electing store never stalls a decision (and no second
event loop runs grpc.aio in the process: gRPC wakes every such loop for each call the
server answers, measured at ~15 % more CPU per decision). Its tasks:

- start-up: take a lease, load the whole prefix once (instances, the bundle in force,
  sessions, quarantines, the leader), adopt the bundle in force (verified) or publish
  ours when there is none, hand the instances to the engine, campaign for leadership;
- then follow one watch from the revision of that read: each change is applied in
  order; a watch that fell behind a
  compaction reloads the prefix and applies the difference; a broken watch resumes from
  the last revision applied;
- report what it runs (`replicas/<name>`, under its lease) and anchor its audit log.

Other threads reach it through synchronous doors, each bounded by `op_timeout`: the
registry writer (direct `engine.register` calls; RPCs await theirs: each write goes
through the request ledger, and one the store did not confirm is kept as *unsettled*
until the store answers, then settled for good and logged), the fence (the
guardian's dangerous acts: one blocking etcd transaction on a plain gRPC channel, so it
works from the serving loop itself), and the session book (background writes, never
waited on).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Coroutine, MutableMapping

from policyc.compiler import bundle_io
from policyc.matcher import Instance
from policyc.matcher.columns import InstanceBatch
from policyc.server import bulk_registration
from policyc.server.errors import ServiceError

from . import anchors, bundle_rollout, instance_codec, signed_reports
from .known_instances import KnownInstances
from .attestation import AttestationBook, AttestedFact, Attestor
from .host_acts import ActSender
from .host_claims import claims_problem, host_values
from .host_facts import HostFacts
from .host_hardware import Hardware
from .link_heal import LinkDownHealer
from .measured_hosts import HostSignalBook
from .config import FleetConfig
from .keys import Keys
from .lease_keeper import LeaseKeeper
from .leadership import Election, Verdict
from .soft_state import QuarantineBoard, QuarantineEntry, SessionBook
from .registry_ledger import Ledger, Op, Outcome, RegistryWrite, Unconfirmed
from .store import Change, ChangeKind, Compacted, FleetStore, Put, Snapshot, StoreError, StoreRefused, StoreUnavailable

if TYPE_CHECKING:
    from policyc.server.app import DecisionServer

    from .shared_engine import SharedRegistryEngine

STORE_TXN = 100  # instance records per transaction of a bulk registration
log = logging.getLogger("policyc.cluster")


REATTEST_REFUSED = 30.0  # seconds before the leader challenges a host whose attestation was refused again

# One swap at a time in a process: building a bundle's state runs the solver (z3), whose
# default context is not safe across threads, and replicas that share a process (tests,
# benchmarks) swap on the same rollout at once (seen: a z3 assertion and a segfault).
_SWAPS = threading.Lock()


def open_store(cfg: FleetConfig) -> FleetStore:
    if cfg.etcd:
        from .etcd_store import EtcdStore

        return EtcdStore(cfg.etcd, op_timeout=cfg.op_timeout)
    from .local_store import LocalStore

    assert cfg.state_dir is not None
    return LocalStore(cfg.state_dir)


def _consequence(w: RegistryWrite, out: Outcome) -> str:
    if w.op is Op.REGISTER:
        return ("the instance is registered" if out is Outcome.APPLIED else
                "the instance is not registered, and a late copy of the write can no longer land; a retry with the same "
                "request id registers it")
    return "the instance is removed" if out is Outcome.APPLIED else "the instance is still registered"


class Replica:
    def __init__(self, cfg: FleetConfig, server: "DecisionServer") -> None:
        self.cfg = cfg
        self.server = server
        self.name = cfg.replica_name
        self.keys = Keys(cfg.prefix)
        self.store = open_store(cfg)
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop, once started
        self._loop_thread: int | None = None
        self._joined = False
        self.keeper = LeaseKeeper(self.store, cfg.lease_ttl, self._on_lease, f"replica {self.name}")
        self.election = Election(self.store, self.keys, self.name, lambda: self.keeper.lease)
        self.sessions = SessionBook(self.keys, cfg.session_ttl, self._submit_put)
        self.quarantines = QuarantineBoard(self.keys)
        self.applied_revision = 0
        self.reloads = 0  # prefix reloads after a compaction
        self.bundle_refused: tuple[str, str] | None = None  # (hash, why) of the last bundle refused
        self._known: MutableMapping[str, tuple[Instance, float | None]] = {}  # what the store holds, admitted or not
        self._tasks: list[asyncio.Task[Any]] = []
        self._following = asyncio.Event()
        self._bundle_lock: asyncio.Lock | None = None
        self.anchored_seq = 0
        self.address = cfg.advertise
        self.ledger = Ledger(self.store, self.keys, self.name)
        self.write_timeout = cfg.op_timeout + 1.0
        self.unsettled: dict[str, RegistryWrite] = {}  # request id → a write the store did not confirm
        self.settled: dict[str, Outcome] = {}  # request id → how an unconfirmed write was settled (the last 1,000)
        self._writing: dict[str, int] = {}  # instance id → writes of it in flight
        self._settler: asyncio.Task[None] | None = None
        self.attestation = AttestationBook(self.keys, cfg.attest_max_age)
        self._attesting_now: dict[str, asyncio.Task[AttestedFact]] = {}
        self.host_facts: dict[str, HostFacts] = {}  # what each host's agent discovered (`agents/<host>`)
        self.acts = ActSender(self)  # self-heal steps sent to the host's agent (the executor's `remote`)
        self.host_signals = HostSignalBook()  # what each host's agent measured last (`signals/<host>`), for the placer
        self.link_heal = LinkDownHealer(self)  # the leader heals a link a host's agent reports down (`link_heal.py`)
        self.local_agent: Any = None  # the embedded default's agent for this host (`local_agent.py`), when it runs one
        self._operator_addresses: dict[str, Any] | None = None  # the endpoint rules' own declarations, kept
        self.dropped_at_load: tuple[bulk_registration.Refusal, ...] = ()  # store instances not served at start, and why
        self._said_refused: dict[str, str] = {}  # instance id -> why it is not served (logged once per reason)
        self._report_keys: dict[str, Any] = {}  # report key (hex) -> its parsed Ed25519 key

    # ================================================================ life cycle
    @property
    def engine(self) -> "SharedRegistryEngine":
        return self.server.engine  # type: ignore[return-value]

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Schedule `coro` on the serving loop from any thread (to wait on it, see `_wait`)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def start(self, address: str) -> None:
        """Join: called on the serving loop once the port is bound, before serving."""
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.address = self.cfg.advertise or address
        batch = await self._join()
        self._joined = True
        self._apply_initial(batch)
        self.engine.writer = self
        g = self.server.guardian
        if g is not None:  # the leader's host steps go to the host's agent, their results into this audit
            self.acts.audit = g.executor.audit
            g.executor.remote = self.acts
        await self._follow_from(self.applied_revision)
        if not self.cfg.shared:  # the embedded default: this host's agent in process (`local_agent.py`)
            from .local_agent import start_local_agent

            try:
                self.local_agent = await start_local_agent(self)
            except (OSError, ValueError, StoreError) as e:
                log.warning("replica %s: the in-process agent did not start: %s", self.name, e)

    async def _join(self) -> InstanceBatch:
        self._bundle_lock = asyncio.Lock()
        await self.store.connect()
        await self.keeper.start()
        snap = await self.store.read_prefix(self.keys.prefix)
        self.applied_revision = snap.revision
        by = self._split(snap)
        self.sessions.load(tuple(by["sessions"]))
        self.quarantines.load(tuple(by["quarantines"]))
        for problem in self.attestation.load(tuple(by["attest"])):
            log.warning("replica %s: %s", self.name, problem)
        for e in by["agents"]:
            self._agent_report(e.key, e.value)
        for e in by["signals"]:
            host = self.keys.id_of(e.key, self.keys.signals)
            self.host_signals.on_report(host, e.value, self._report_verifier(host))
        leader = next((e for e in by["leader"]), None)
        if leader is not None:
            self.election.leader, self.election.leader_token = leader.value.decode(), leader.create_revision
        # the store's instances as columns (no object per instance): a record that is not one,
        # or whose fields are wrong, is refused here, naming its key and field
        records = []
        for e in by["instances"]:
            try:
                records.append(instance_codec.record(e.key, e.value))
            except instance_codec.InstanceCodecError as err:
                log.warning("replica %s: %s", self.name, err)
        # off the loop (the lease keeps being refreshed meanwhile): ~0.3 s of checks at 100,000
        batch, _, bad = await asyncio.to_thread(bulk_registration.batch_from_records, records)
        for r in bad:
            log.warning("replica %s: store record refused: %s", self.name, r.reason)
        stored = set(batch.ids)
        # instances registered here before joining are this replica's registrations: store them too
        local = [(i, None) for i, _, _ in self.server.state.registry.entries() if i.id not in stored]
        for inst, score in local:
            await self.store.put(self.keys.instance(inst.id), instance_codec.encode(inst, score))
        self._known = KnownInstances(batch)
        self._known.update({i.id: (i, s) for i, s in local})
        pointer = next((e for e in by["bundle"]), None)
        current, ours = (pointer.value.decode() if pointer is not None else ""), self.server.state.bundle_hash
        if not self.cfg.shared:
            if current != ours:  # one process: the bundle it was started with is the one in force
                await bundle_rollout.roll_out(self.store, self.keys, self.server.state.bundle, expect=current)
        elif not current:
            try:
                await bundle_rollout.roll_out(self.store, self.keys, self.server.state.bundle, expect="")
            except bundle_rollout.RolloutError:  # another replica published first: follow it
                await self._adopt(await bundle_rollout.in_force(self.store, self.keys))
        elif current != ours:
            log.warning("replica %s joins on the cluster's bundle %s…, not the one it was started with (%s…); "
                        "roll that out with `policyc cluster rollout`", self.name, current[:23], ours[:23])
            await self._adopt(current)
        if not self.election.leader:
            await self.election.campaign()
        await self._report()
        return batch

    def _split(self, snap: Snapshot) -> dict[str, list[Any]]:
        k = self.keys
        out: dict[str, list[Any]] = {"instances": [], "sessions": [], "quarantines": [], "leader": [], "bundle": [], "attest": [], "agents": [],
                                     "signals": []}
        for e in snap.entries:
            if e.key.startswith(k.instances):
                out["instances"].append(e)
            elif e.key.startswith(k.sessions):
                out["sessions"].append(e)
            elif e.key.startswith(k.quarantines):
                out["quarantines"].append(e)
            elif e.key == k.leader:
                out["leader"].append(e)
            elif e.key == k.bundle:
                out["bundle"].append(e)
            elif e.key.startswith(k.attest):
                out["attest"].append(e)
            elif e.key.startswith(k.agents):
                out["agents"].append(e)
            elif e.key.startswith(k.signals):
                out["signals"].append(e)
        return out

    def _apply_initial(self, batch: InstanceBatch) -> None:
        """On the serving loop: the store's instances this bundle admits, whose endpoint the
        endpoint rules allow and whose host's claims are trusted, in one columnar batch.
        What is dropped stays in `_known` and is logged with why (`dropped_at_load`)."""
        service = self.server.service
        rules, topology = service.endpoints, service.topology()

        def endpoint(iid: str, ep: str, host: str) -> str | None:
            if not host:
                return None
            try:
                rules.check(iid, ep, host, topology)
            except ServiceError as e:
                return e.message
            return None
        reg = self.server.state.registry
        # the rows on a host whose agent reports its facts, judged against them (`host_claims.py`)
        hosts, contradicted = batch.strs["host"], []
        judged = {h for h in (set(self.host_facts) | set(self.attestation.enrolled)) if self.reports_facts(h)}
        for row in ([i for i, h in enumerate(hosts) if h in judged] if judged else []):
            inst = batch.instance(row)
            refused_claim = self.host_problem(inst)
            if refused_claim is not None:
                contradicted.append(bulk_registration.Refusal(row, self.keys.instance(inst.id), inst.id,
                                                              refused_claim.field or "deployment", refused_claim.message))
        if contradicted:
            bad_rows = {r.index for r in contradicted}
            batch = bulk_registration.subset(batch, [i for i in range(len(batch)) if i not in bad_rows])
        taken = [iid for iid in batch.ids if iid in reg]
        keep, _, refused = bulk_registration.screen(
            batch, self.server.state.bundle, endpoint=endpoint, host_check=self.attestation.tpm_problem, taken=taken,
            wheres=[self.keys.instance(iid) for iid in batch.ids])
        taken_ids = set(taken)
        self.dropped_at_load = tuple(contradicted) + tuple(r for r in refused if r.instance_id not in taken_ids)
        for r in self.dropped_at_load:
            log.warning("replica %s does not serve instance %s (in the store at %s): %s", self.name, r.instance_id,
                        r.where, r.reason)
        self.engine.apply_register_batch(keep)

    async def _follow_from(self, revision: int) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(revision)), loop.create_task(self._reporting()),
                       loop.create_task(self._housekeeping()), loop.create_task(self._attesting())]

    async def stop(self) -> None:
        """Leave: revoke the lease (the report and any leadership go at once)."""
        await self._leave(revoke=True)

    async def crash(self) -> None:
        """Stop without a goodbye, as a killed process would: the lease lapses within its TTL."""
        await self._leave(revoke=False)

    async def _leave(self, *, revoke: bool) -> None:
        if not self._joined:
            return
        self._joined = False
        self.engine.writer = None

        async def leave() -> None:
            if self.local_agent is not None:
                await self.local_agent.stop()
                self.local_agent = None
            attesting = list(self._attesting_now.values())
            for t in self._tasks + ([self._settler] if self._settler is not None else []) + attesting:
                t.cancel()
            # a challenge in flight is withdrawn (its lease revoked) while the store is still open, not
            # left pending for the loop's close to destroy (a traceback when stopped mid-attestation)
            await asyncio.gather(*attesting, return_exceptions=True)
            await self.keeper.stop(revoke=revoke)
            await self.store.close()
        try:
            await asyncio.wait_for(leave(), self.cfg.op_timeout + 2)
        except (asyncio.TimeoutError, StoreError) as e:
            log.warning("replica %s: leaving: %s", self.name, e)

    def pause(self) -> None:
        """Stop refreshing the lease and reading the store, as SIGSTOP would: the replica
        keeps believing what it last saw (e.g. that it leads), and its watch stream is
        gone, so `resume` watches again from the last revision it applied (and reloads if
        the store compacted that history meanwhile)."""
        self.keeper.pause()

        def stop_following() -> None:
            self._following.clear()
            if self._tasks:
                self._tasks[0].cancel()
        assert self.loop is not None
        self.loop.call_soon_threadsafe(stop_following)

    def resume(self) -> None:
        self.keeper.resume()

        def follow_again() -> None:
            self._following.set()
            if self._tasks:
                assert self.loop is not None
                self._tasks[0] = self.loop.create_task(self._follow(self.applied_revision))
        assert self.loop is not None
        self.loop.call_soon_threadsafe(follow_again)

    # ================================================================ the watch
    async def _follow(self, revision: int) -> None:
        self._following.set()
        while True:
            try:
                async for ch in self.store.watch(self.keys.prefix, revision + 1):
                    await self._following.wait()
                    await self._dispatch(ch)
                    self.applied_revision = revision = max(revision, ch.revision)
            except Compacted as c:
                log.warning("replica %s fell behind a compaction (%s); reloading", self.name, c)
                revision = await self._reload()
            except StoreUnavailable as e:
                log.info("replica %s: watch interrupted (%s); resuming from %d", self.name, e, revision + 1)
                await asyncio.sleep(0.1)
            except StoreError as e:
                log.warning("replica %s: watch: %s", self.name, e)
                await asyncio.sleep(0.5)

    async def _reload(self) -> int:
        while True:
            try:
                snap = await self.store.read_prefix(self.keys.prefix)
                break
            except StoreError as e:
                log.warning("replica %s: reload: %s", self.name, e)
                await asyncio.sleep(0.2)
        by = self._split(snap)
        items = {}
        for entry in by["instances"]:
            try:
                i, s = instance_codec.decode(entry.key, entry.value)
                items[i.id] = (i, s)
            except instance_codec.InstanceCodecError as err:
                log.warning("%s", err)
        self._known = items
        self.sessions.load(tuple(by["sessions"]))
        self.quarantines.load(tuple(by["quarantines"]))
        self.attestation.load(tuple(by["attest"]))
        self.host_facts.clear()
        for report in by["agents"]:
            self._agent_report(report.key, report.value)
        self.host_signals.reports.clear()
        for report in by["signals"]:
            host = self.keys.id_of(report.key, self.keys.signals)
            self.host_signals.on_report(host, report.value, self._report_verifier(host))
        self._on_serving(self._converge)
        self.reloads += 1
        pointer = next((e for e in by["bundle"]), None)
        if pointer is not None:
            await self._adopt(pointer.value.decode())
        self.applied_revision = snap.revision
        return snap.revision

    def _converge(self) -> None:
        """On the serving loop: make the registry what the store holds (except instances
        with a write in flight or not yet settled: their truth is not known yet)."""
        reg = self.server.state.registry
        busy = set(self._writing) | {w.instance_id for w in self.unsettled.values()}
        for inst, _, _ in reg.entries():
            if inst.id not in self._known and inst.id not in busy:
                self.engine.apply_deregister(inst.id)
        for i, s in list(self._known.values()):
            if i.id not in busy:
                self._apply_put(i, s)

    def _on_serving(self, fn: Callable[[], None]) -> None:
        """Apply after the change in hand, in order (the loop runs callbacks FIFO)."""
        assert self.loop is not None
        self.loop.call_soon(fn)

    def _unattested(self, inst: Instance) -> str:
        """Why this replica does not trust the instance's `tpm` claim ("" when it does)."""
        problem = self.attestation.tpm_problem(inst.deployment.host, inst.deployment.tpm)
        if problem:
            log.warning("replica %s does not serve instance %s: %s", self.name, inst.id, problem)
        return problem

    def store_problem(self, inst: Instance) -> str:
        """Why this replica does not serve an instance the store holds ("" when it does):
        the endpoint rules RegisterInstance applies (`server/endpoint_rules.py`, with the
        addresses the hosts' agents report) and its host's own facts (`host_claims.py`).
        The same rules as RegisterInstance, applied to what arrives by snapshot, watch or
        reload: a record written straight into the store gets no further."""
        d = inst.deployment
        rules = getattr(self.server.service, "endpoints", None)
        if rules is not None and d.host and d.endpoint:
            try:
                rules.check(inst.id, d.endpoint, d.host, self.server.service.topology())
            except ServiceError as e:
                return e.message
        refused = self.host_problem(inst)
        return refused.message if refused is not None else ""

    def host_problem(self, inst: Instance) -> ServiceError | None:
        """The refusal of a claim of `inst` its host's own agent contradicts (E733), or None."""
        return claims_problem(inst, self._judging_facts(inst.deployment.host))

    def reports_facts(self, host: str) -> bool:
        """Whether `host`'s agent reports hardware and site facts to judge claims by."""
        f = self._judging_facts(host)
        return f is not None and f.hardware is not None

    def _report_verifier(self, host: str) -> Callable[[bytes], str] | None:
        """For an enrolled host, what its signal reports must pass (`signed_reports.py`):
        signed with the report key of its last verified quote; None for any other host."""
        if host not in self.attestation.enrolled:
            return None
        fact = self.attestation.attested(host)
        if fact is None or not fact.report_key:
            why = (f"host {host} is enrolled but has no verified quote with a report key (attested: "
                   f"{'yes' if fact is not None else 'no'}): its reports are not merged")
            return lambda raw: why
        key = self._report_keys.get(fact.report_key)
        if key is None:
            try:
                key = signed_reports.public_key(fact.report_key)
            except ValueError as e:
                bad = f"host {host}: the report key of its verified quote: {e}"
                return lambda raw: bad
            self._report_keys = {fact.report_key: key, **dict(list(self._report_keys.items())[:255])}
        return lambda raw: signed_reports.verify(raw, key)

    def _judging_facts(self, host: str) -> HostFacts | None:
        """The facts claims on `host` are judged by: its agent's report, or for an enrolled
        host only what its last verified quote signed (as for its addresses)."""
        if host not in self.attestation.enrolled:
            return self.host_facts.get(host)
        fact = self.attestation.attested(host)
        if fact is None or fact.hardware is None:
            return None
        try:
            return HostFacts(host, (), hardware=Hardware.from_json(fact.hardware))
        except ValueError as e:
            log.warning("replica %s: host %s: the attested hardware facts: %s", self.name, host, e)
            return None

    def _apply_put(self, inst: Instance, score: float | None) -> None:
        if self._unattested(inst):  # kept aside (in `_known`) until its host is attested
            self.engine.apply_deregister(inst.id)
            return
        problem = self.store_problem(inst)
        if problem:  # kept aside (in `_known`): its host's next report may admit it
            if inst.id in self.server.state.registry or self._said_refused.get(inst.id) != problem:
                log.warning("replica %s does not serve instance %s (in the store at %s): %s", self.name, inst.id,
                            self.keys.instance(inst.id), problem)
            self._said_refused[inst.id] = problem
            self.engine.apply_deregister(inst.id)
            return
        self._said_refused.pop(inst.id, None)
        try:
            self.engine.apply_register(inst, score)
        except ServiceError as e:
            log.warning("replica %s does not serve instance %s: %s", self.name, inst.id, e.message)

    async def _dispatch(self, ch: Change) -> None:
        k = self.keys
        if ch.key.startswith(k.signals):  # the hottest key: every host, every tick
            host = k.id_of(ch.key, k.signals)
            if ch.kind is ChangeKind.PUT:
                taken = self.host_signals.received
                self.host_signals.on_report(host, ch.value, self._report_verifier(host))
                if self.host_signals.received != taken:  # a report, not a refused one: a link it says went down is healed
                    self.link_heal.on_report(host, self.host_signals.reports[host])
            else:
                self.host_signals.forget(host)
                self.link_heal.forget(host)
        elif ch.key.startswith(k.act_results):
            if ch.kind is ChangeKind.PUT:
                self.acts.on_result(ch.key, ch.value)
        elif ch.key.startswith(k.instances):
            iid = k.id_of(ch.key, k.instances)
            if ch.kind is ChangeKind.DELETE:
                self._known.pop(iid, None)
                self._said_refused.pop(iid, None)
                self._on_serving(lambda: self.engine.apply_deregister(iid))
            else:
                try:
                    inst, score = instance_codec.decode(ch.key, ch.value)
                except instance_codec.InstanceCodecError as err:
                    log.warning("%s", err)
                    return
                self._known[iid] = (inst, score)
                self._on_serving(lambda: self._apply_put(inst, score))
        elif ch.key.startswith(k.sessions):
            self.sessions.on_change(ch)
        elif ch.key.startswith(k.quarantines):
            self.quarantines.on_change(ch)
            q = self.quarantines.get(k.id_of(ch.key, k.quarantines)) if ch.kind is ChangeKind.PUT else None
            if q is not None and q.by != self.name:
                self._on_serving(lambda: self._follow_quarantine(q))
        elif ch.key == k.leader:
            if self.election.on_change(ch):
                asyncio.get_running_loop().create_task(self._campaign())
        elif ch.key == k.bundle and ch.kind is ChangeKind.PUT:
            asyncio.get_running_loop().create_task(self._adopt(ch.value.decode()))
        elif ch.key.startswith(k.enrolled_hosts) or ch.key.startswith(k.attested_facts):
            problem = self.attestation.on_change(ch)
            if problem:
                log.warning("replica %s: %s", self.name, problem)
            host = ch.key.rpartition("/")[2]
            self._declare_addresses(host)
            if (ch.key.startswith(k.enrolled_hosts) and ch.kind is ChangeKind.PUT and self.election.token
                    and host in self.host_facts):
                asyncio.get_running_loop().create_task(self._attest_quietly(host))
            self._on_serving(self._converge)  # `tpm` claims trusted or not from now on
        elif ch.key.startswith(k.agents):
            if ch.kind is ChangeKind.PUT:
                self._agent_report(ch.key, ch.value)
            else:
                self.host_facts.pop(k.id_of(ch.key, k.agents), None)

    def _follow_quarantine(self, q: QuarantineEntry) -> None:
        """On the serving loop: the leader's quarantine, applied to this replica's guardian."""
        g = self.server.guardian
        if g is None:
            return
        from policyc.enforcer.endpoint import Endpoint, EndpointError

        try:
            backend, backup = Endpoint.parse(q.backend), Endpoint.parse(q.backup)
        except EndpointError as e:
            log.warning("replica %s: quarantine of %s not followed: %s", self.name, q.backend, e)
            return
        g.adopt_quarantine(backend, backup, q.until - time.time(), q.rule,
                           f"decided by leader {q.by} under fencing token {q.token}")

    async def _campaign(self) -> None:
        try:
            await self.election.campaign()
            await self._report()
        except StoreError as e:
            log.warning("replica %s: campaign: %s", self.name, e)

    # ================================================================ bundles
    async def _adopt(self, want: str) -> None:
        """Verify the bundle the pointer names and swap to it; refuse it otherwise."""
        assert self._bundle_lock is not None
        async with self._bundle_lock:
            if want == self.server.state.bundle_hash:
                return
            key = self.keys.bundle_blob(want)
            try:
                got = await self.store.get(key)
                bundle = await asyncio.to_thread(bundle_rollout.verify_blob, key, got.value if got else None, want, self._verify_text)
                await self._swap(bundle)
            except (bundle_io.BundleError, ServiceError) as e:
                why = e.message if isinstance(e, ServiceError) else str(e)
                self.bundle_refused = (want, why)
                log.error("replica %s refused bundle %s…, still serving %s…: %s", self.name, want[:23],
                          self.server.state.bundle_hash[:23], why)
            except StoreError as e:
                self.bundle_refused = (want, f"could not read it: {e}")
                log.error("replica %s could not read bundle %s…: %s", self.name, want[:23], e)
            else:
                self.bundle_refused = None
                log.warning("replica %s now runs bundle %s…", self.name, want[:23])
            await self._report()

    def _verify_text(self, raw: bytes, origin: str) -> Any:
        """The server's verifier (schema, hash, signature when it has a key, the compiler's
        re-validation); a key given to the fleet config is required on top."""
        bundle = self.server.service.verifier.load_text(raw, origin)
        if self.cfg.public_key is not None:
            bundle = bundle_io.loads(raw, origin=origin, public_key=self.cfg.public_key)
        return bundle

    async def _swap(self, bundle: Any) -> None:
        """The service's reload (metrics, audit, request shapes), with
        inadmissible instances evicted here only (the store keeps them), then the store's
        instances the new bundle admits."""
        await asyncio.to_thread(_SWAPS.acquire)
        try:
            await self.server.service.reload(bundle, True)
        finally:
            _SWAPS.release()
        self._converge()

    def roll_out(self, bundle: Any, expect: str | None = None, timeout: float | None = None) -> bundle_rollout.Rollout:
        """Make `bundle` the one in force cluster-wide (compare-and-swap); from any thread
        but the replica's."""
        return self._wait(self._run(bundle_rollout.roll_out(self.store, self.keys, bundle, expect=expect)), "rollout",
                          timeout or self.cfg.op_timeout * 2)

    # ================================================================ reporting
    async def _on_lease(self, lease: int) -> None:
        if self.election.token or self.election.leader == self.name:
            self.election.token = 0  # the old lease took the leader key with it
        await self._report()
        if not self.election.leader or self.election.leader == self.name:
            await self._campaign()

    def report(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "pid": os.getpid(), "bundle": self.server.state.bundle_hash,
                "refused_bundle": ({"hash": self.bundle_refused[0], "why": self.bundle_refused[1]} if self.bundle_refused else None),
                "applied_revision": self.applied_revision, "instances": len(self.server.state.registry),
                "leader": self.election.token != 0, "token": self.election.token, "lease_ttl": self.cfg.lease_ttl,
                "store": self.store.description, "time": time.time(), "unsettled": len(self.unsettled)}

    async def _report(self) -> None:
        if self.keeper.lease:
            await self.store.put(self.keys.replica(self.name), json.dumps(self.report()).encode(), self.keeper.lease)

    async def _reporting(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.report_interval)
            await self._following.wait()
            try:
                await self._report()
                audit = self.server.config.audit_log
                if audit is not None and Path(audit).exists():
                    self.anchored_seq = await anchors.anchor(self.store, self.keys, self.name, Path(audit), self.anchored_seq)
            except StoreError as e:
                log.info("replica %s: report: %s", self.name, e)
            except Exception as e:  # noqa: BLE001 - an audit read problem must not stop reporting
                log.warning("replica %s: anchoring the audit log: %s", self.name, e)

    async def _housekeeping(self) -> None:
        """The leader deletes expired sessions and quarantines (everyone already ignores them)."""
        while True:
            await asyncio.sleep(max(1.0, self.cfg.lease_ttl / 2))
            if not self.election.token:
                continue
            try:
                for s in self.sessions.expired():
                    await self.store.delete(self.keys.session(s))
                for b in self.quarantines.expired():
                    await self.store.delete(self.keys.quarantine(b))
            except StoreError as e:
                log.info("replica %s: housekeeping: %s", self.name, e)

    # ================================================================ host agents
    def _agent_report(self, key: str, raw: bytes) -> None:
        """A host agent's report: its discovered addresses become that host's for the
        endpoint rules (an endpoint on another host's address is refused): the agent's word
        for a host that is not enrolled, only what its quote signed for one that is (the
        leader attests such a host as soon as its agent reports)."""
        host = self.keys.id_of(key, self.keys.agents)
        try:
            body = json.loads(raw)
            facts = HostFacts.from_json(body["facts"]) if body.get("facts") else None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("replica %s: %s: not an agent report (%s)", self.name, key, e)
            return
        if facts is None or facts.host != host:
            return
        before = self.host_facts.get(host)
        self.host_facts[host] = facts
        self._declare_addresses(host)
        if self._joined and facts != before:  # the host's instances judged again against what it reports now
            self._on_serving(lambda: self._reapply_host(host))
        signed = self.attestation.attested(host)
        if host in self.attestation.enrolled and self.election.token and host not in self._attesting_now and (
                signed is None or signed.report_key != facts.report_key
                or signed.hardware != (facts.hardware.to_json() if facts.hardware is not None else None)):
            # not attested yet, or its agent now reports other facts than its last quote signed (a restarted
            # agent has a new report key): attested again now, not at the next round
            asyncio.get_running_loop().create_task(self._attest_quietly(host))

    def _reapply_host(self, host: str) -> None:
        """On the serving loop: the store's instances on `host` applied again (after its
        agent's report changed: an address or a fact it now has or no longer has)."""
        busy = set(self._writing) | {w.instance_id for w in self.unsettled.values()}
        of_host = getattr(self._known, "of_host", None)
        ids = of_host(host) if of_host is not None else [i for i, (inst, _) in self._known.items() if inst.deployment.host == host]
        for iid in ids:
            if iid not in busy and iid in self._known:
                inst, score = self._known[iid]
                self._apply_put(inst, score)

    def _declare_addresses(self, host: str) -> None:
        """The addresses the endpoint rules take as `host`'s: the operator's, plus the
        attested ones (an enrolled host) or the agent's report (one that is not)."""
        rules = getattr(self.server.service, "endpoints", None)
        if rules is None:
            return
        if self._operator_addresses is None:
            self._operator_addresses = dict(rules.declared)
        if host in self.attestation.enrolled:
            fact = self.attestation.attested(host)
            mine = set(fact.addresses) if fact is not None else set()
        else:
            facts = self.host_facts.get(host)
            mine = facts.routable() if facts is not None else set()
        base = self._operator_addresses.get(host)
        if base:
            rules.declared[host] = base
        else:
            rules.declared.pop(host, None)
        for ip in sorted(mine):
            rules.declare(host, ip)

    async def _attest_quietly(self, host: str) -> None:
        from .tpm_quote import AttestationError

        try:
            await self.attest(host)
        except (AttestationError, StoreError) as e:
            log.warning("replica %s: host %s not attested: %s", self.name, host, e)

    # ================================================================ attestation
    async def attest(self, host: str) -> AttestedFact:
        """Challenge `host`'s agent now and record the result (AttestationError: refused).
        Callers that ask while one is in flight for that host share it."""
        running = self._attesting_now.get(host)
        if running is None:
            running = self._attesting_now[host] = asyncio.get_running_loop().create_task(self._attest(host))
            running.add_done_callback(lambda _: self._attesting_now.pop(host, None))
        return await asyncio.shield(running)

    async def _attest(self, host: str) -> AttestedFact:
        try:
            fact = await Attestor(self.store, self.keys, self.name).attest(host)
        except Exception:
            self.attestation.facts.pop(host, None)  # the refusal's record arrives by the watch
            raise
        self.attestation.facts[host] = fact  # before the watch brings it: the caller rechecks now
        self._declare_addresses(host)
        log.info("replica %s: host %s attested (key %s…, PCRs %s)", self.name, host, fact.ak_name[:16],
                 ",".join(str(i) for i in sorted(fact.pcrs)))
        return fact

    def attest_later(self, host: str) -> Future[AttestedFact]:
        return self._run(self.attest(host))

    def can_attest(self, host: str) -> bool:
        """Whether a registration may challenge `host` now: it is enrolled, and its last
        attestation is not a refusal younger than `REATTEST_REFUSED` (so retried
        registrations do not each wait out an agent that is down, or challenge it again)."""
        if host not in self.attestation.enrolled:
            return False
        f = self.attestation.facts.get(host)
        return f is None or f.attested or time.time() - f.time > REATTEST_REFUSED

    def tpm_problem(self, inst: Instance) -> str:
        return self.attestation.tpm_problem(inst.deployment.host, inst.deployment.tpm)

    def attested_facts(self, inst: Instance) -> dict[str, str]:
        """The instance's facts an attestation vouched for, each with the key name: `tpm`
        (claimed and attested), and the hardware and site facts its host's verified quote
        signed and its claims equal (judged by `host_problem` before this is asked)."""
        out: dict[str, str] = {}
        name = self.attested_name(inst)
        if name:
            out["tpm"] = name
        f = self.attestation.attested(inst.deployment.host)
        judged = self._judging_facts(inst.deployment.host) if f is not None else None
        if f is not None and judged is not None and judged.hardware is not None:
            for fact, (truth, _) in host_values(judged.hardware, inst.deployment.gpu).items():
                if getattr(inst.deployment, fact) == truth:
                    out[fact] = f.ak_name
        return out

    def attested_name(self, inst: Instance) -> str:
        """The attestation key name behind the instance's `tpm` fact ("" when it claims none)."""
        f = self.attestation.attested(inst.deployment.host) if inst.deployment.tpm else None
        return f.ak_name if f is not None else ""

    async def _attesting(self) -> None:
        """The leader keeps the attestation of every enrolled host whose agent reports fresh:
        attested when it has none, again at half its maximum age, and a refused one again
        after `REATTEST_REFUSED`; a host whose agent does not answer, or answers wrongly, is
        recorded as refused, and its `tpm` instances stop being served."""
        from .tpm_quote import AttestationError

        while True:
            await asyncio.sleep(1.0)
            if not self.election.token:
                continue
            now = time.time()
            due = [h for h in self.attestation.enrolled if h in self.host_facts and h not in self._attesting_now
                   and ((f := self.attestation.facts.get(h)) is None
                        or now - f.time > (self.cfg.attest_max_age / 2 if f.attested else REATTEST_REFUSED))]
            for host, got in zip(due, await asyncio.gather(*(self.attest(h) for h in due), return_exceptions=True)):
                if isinstance(got, (AttestationError, StoreError)):
                    log.warning("replica %s: host %s not attested: %s", self.name, host, got)
                elif isinstance(got, BaseException):
                    log.error("replica %s: attesting host %s: %s: %s", self.name, host, type(got).__name__, got)

    # ================================================================ doors for the serving side
    def put_instances(self, items: list[tuple[Instance, float | None]]) -> None:
        """RegistryWriter, bulk: store the instances (no lease: they stay until deregistered)."""
        async def put() -> None:
            for inst, score in items:
                self._known[inst.id] = (inst, score)
                await self.store.put(self.keys.instance(inst.id), instance_codec.encode(inst, score))
        self._wait(self._run(put()), "registration")

    async def store_instances(self, items: list[tuple[Instance, float | None]]) -> None:
        """RegistryWriter, bulk, on the serving loop: plain puts (no lease), `STORE_TXN` to a
        transaction (etcd refuses more than 128 operations in one)."""
        for at in range(0, len(items), STORE_TXN):
            chunk = items[at:at + STORE_TXN]
            await self.store.transact([], [Put(self.keys.instance(i.id), instance_codec.encode(i, s)) for i, s in chunk])
            for i, s in chunk:
                self._known[i.id] = (i, s)

    def write_later(self, w: RegistryWrite) -> Future[Outcome]:
        """RegistryWriter: one registration or removal under its request id, on the loop."""
        return self._run(self._write(w))

    def write(self, w: RegistryWrite) -> Outcome:
        try:
            return self._wait(self.write_later(w), w.describe(), self.write_timeout + 2)  # type: ignore[no-any-return]
        except StoreUnavailable as e:
            if isinstance(e, Unconfirmed):
                raise
            raise Unconfirmed(w, str(e)) from None

    def applied_before_later(self, w: RegistryWrite) -> Future[bool]:
        return self._run(self.ledger.applied_before(w))

    def reconcile(self) -> None:
        """Make this replica's registry what the store holds again (after a refused write)."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._converge)

    async def _write(self, w: RegistryWrite) -> Outcome:
        """The write, bounded by `write_timeout`; past that, or on any failure that is not a
        refusal, it is unsettled (settled in the background once the store answers)."""
        iid = w.instance_id
        self._writing[iid] = self._writing.get(iid, 0) + 1
        try:
            out = await asyncio.wait_for(self.ledger.apply(w), self.write_timeout)
        except (StoreRefused, ValueError):
            raise
        except (StoreError, asyncio.TimeoutError) as e:
            why = str(e) or f"no answer within {self.write_timeout:g} s"
            self._unsettle(w, why)
            raise Unconfirmed(w, why) from None
        finally:
            self._writing[iid] -= 1
            if not self._writing[iid]:
                del self._writing[iid]
        if w.op is Op.REGISTER:
            self._known[iid] = instance_codec.decode(self.keys.instance(iid), w.value)
        else:
            self._known.pop(iid, None)
        return out

    def _unsettle(self, w: RegistryWrite, why: str) -> None:
        self.unsettled[w.request_id] = w
        log.warning("replica %s: the %s was not confirmed by the fleet store (%s): outcome unknown until the store answers",
                    self.name, w.describe(), why)
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._settling())

    async def _settling(self) -> None:
        """Settle every unconfirmed write once the store answers (claiming its request id
        decides it for good), log each outcome, and make the registry the store's again."""
        pause = 0.2
        while self.unsettled:
            for rid, w in list(self.unsettled.items()):
                try:
                    out = await self.ledger.settle(w)
                except StoreError as e:
                    log.info("replica %s: settling the %s: the store does not answer yet (%s)", self.name, w.describe(), e)
                    break
                self.unsettled.pop(rid, None)
                self.settled[rid] = out
                while len(self.settled) > 1000:
                    self.settled.pop(next(iter(self.settled)))
                log.warning("replica %s: the %s is settled: %s (%s)", self.name, w.describe(), out.value, _consequence(w, out))
                self._on_serving(self._converge)
            else:
                continue
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    def _wait(self, fut: Future[Any], what: str, timeout: float | None = None) -> Any:
        """Wait for work scheduled on the serving loop, from another thread (waiting on the
        loop's own thread would block it forever: refused, naming the async door)."""
        if threading.get_ident() == self._loop_thread:
            fut.cancel()
            raise RuntimeError(f"{what}: called on the serving loop, which would block it; await "
                               "`engine.register_shared` / `deregister_shared` there instead")
        limit = timeout or self.cfg.op_timeout + 1
        try:
            return fut.result(limit)
        except TimeoutError:
            raise StoreUnavailable(f"{self.store.description}: {what} not confirmed within {limit:g} s") from None

    def admit(self, kind: str, target: str, detail: str, *, rule: str = "", backup: str = "",
              expires_at: float | None = None) -> Verdict:
        """The fence (see `leadership.py`): may this replica take this dangerous act now?
        A quarantine it admits is also published (same transaction) for the others to follow."""
        if self.election.token == 0:
            return Verdict(False, 0, f"replica {self.name} is not the leader ({self.election.leader or 'no one'} leads); the leader acts")
        extra: list[Put] = []
        if kind == "quarantine" and expires_at is not None:
            extra.append(Put(self.keys.quarantine(target), QuarantineBoard.encode(
                QuarantineEntry(target, backup, expires_at, rule, self.name, self.election.token))))
        return self.election.fenced_now(kind, target, detail, extra, self.cfg.op_timeout)

    def _submit_put(self, op: Put) -> None:
        """Background write (session affinity): never waited on; retried a few times."""
        async def put() -> None:
            for attempt in range(3):
                try:
                    await self.store.put(op.key, op.value, op.lease)
                    return
                except StoreError as e:
                    if attempt == 2:
                        log.warning("replica %s: could not publish %s: %s", self.name, op.key, e)
                    await asyncio.sleep(0.2)
        if self._joined:
            self._run(put())

    # ================================================================ for status and tests
    def wait_until(self, cond: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.01)
        return cond()

    def delete_key(self, key: str) -> None:
        self._wait(self._run(self.store.delete(key)), f"delete {key}")
