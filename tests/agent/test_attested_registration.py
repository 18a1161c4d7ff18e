"""Attested TPM facts on the path registrations take: real software TPMs (one per host),
host agents answering challenges through a real etcd, two policyc replicas.

- an instance claiming `tpm` on an enrolled host whose agent's quote verifies is accepted;
  the fact is recorded as attested (key, PCRs) and the instance's record says so;
- a `tpm` claim on a host without an enrolled key is refused (E732, `deployment.tpm`);
- a host enrolled with one TPM's key whose agent quotes with another TPM (a forged quote)
  is refused, and the refusal is recorded;
- an old quote replayed to a new challenge is refused, and the host's `tpm` instances stop
  being trusted;
- an instance written straight into etcd with an unattested `tpm` claim is not served;
- an instance that claims no TPM needs no attestation.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Coroutine

import grpc
import pytest
from agent_rig import eventually, new_prefix, replica
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from policyc.cluster import instance_codec
from policyc.cluster.agent import InstanceAgent
from policyc.cluster.attestation import AttestedFact, encode_answer, enroll, qualifying_data
from policyc.cluster.etcd_store import EtcdStore
from policyc.cluster.host_agent import HostAgent
from policyc.cluster.keys import Keys
from policyc.cluster.tpm_quote import AttestationError, AttestationKey
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc


class Loop:
    """An event loop in a thread, for the agents and the test's own store client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def _register(th, inst, **dep_changes):  # type: ignore[no-untyped-def]
    dep = {k: v for k, v in inst.deployment.model_dump().items() if k in pb.Deployment.DESCRIPTOR.fields_by_name}
    dep.update(dep_changes)
    with grpc.insecure_channel(f"127.0.0.1:{th.server.port}") as ch:
        return pb_grpc.DecisionsStub(ch).RegisterInstance(
            pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep)), timeout=60)


def _refusal(th, inst) -> tuple[grpc.RpcError, error_details_pb2.ErrorInfo]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        _register(th, inst)
    st = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    assert st is not None
    info = error_details_pb2.ErrorInfo()
    next(d for d in st.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)).Unpack(info)
    return err.value, info


@pytest.fixture
def fleet(bundle, etcd, tpms):  # type: ignore[no-untyped-def]
    prefix = new_prefix()
    keys = Keys(prefix)
    bg = Loop()
    store = EtcdStore(etcd.endpoints)
    bg.run(store.connect())
    reps = [replica(bundle, etcd, f"r{i}", prefix) for i in range(2)]
    agents: list[HostAgent] = []
    try:
        yield {"keys": keys, "bg": bg, "store": store, "replicas": reps, "agents": agents}
    finally:
        for a in agents:
            bg.run(a.stop())
        for th in reps:
            th.stop()
        bg.run(store.close())
        bg.close()


def test_tpm_claims_are_trusted_only_as_attested(fleet, bundle, tpms, etcd, caplog, capsys) -> None:  # type: ignore[no-untyped-def]
    keys, bg, store, (r0, r1) = fleet["keys"], fleet["bg"], fleet["store"], fleet["replicas"]
    slots = r0.server.cluster.gpu_slots()
    finance = admissible_fleet(bundle, slots, models=["fraud-scorer"])[0]  # host-0002: its contract requires a TPM
    rec = {i.deployment.host: i for i in admissible_fleet(bundle, slots, models=["recommender"])}
    assert finance.deployment.host == "host-0002" and finance.deployment.tpm
    assert all(rec[h].deployment.tpm for h in ("host-0001", "host-0005", "host-0006")) and not rec["host-0000"].deployment.tpm

    def start_agent(host: str, tpm: str) -> HostAgent:
        agent = HostAgent(store, keys, host, tpms[tpm])
        bg.run(agent.start())
        fleet["agents"].append(agent)
        return agent

    # the operator enrolls three hosts; host-0005 with TPM b's key, but its agent holds TPM c
    for host, tpm in (("host-0002", "a"), ("host-0005", "b"), ("host-0006", "d")):
        bg.run(enroll(store, keys, host, tpms[tpm].attestation_key(), pcrs=(0, 1, 2, 7), by="test operator"))
    agent_a = start_agent("host-0002", "a")
    start_agent("host-0005", "c")
    for th in (r0, r1):
        eventually(lambda th=th: len(th.server.replica.attestation.enrolled) == 3, 10)

    # ---- attested: accepted, recorded as attested, served everywhere
    _register(r0, finance)
    for th in (r0, r1):
        eventually(lambda th=th: finance.id in th.server.state.registry, 10)
    got = bg.run(store.get(keys.attested_fact("host-0002")))
    fact = AttestedFact.decode(got.key, got.value)
    ak_a = AttestationKey.parse(tpms["a"].attestation_key()).name.hex()
    assert fact.attested and fact.ak_name == ak_a and sorted(fact.pcrs) == [0, 1, 2, 7] and fact.verified_by in ("r0", "r1")
    record = bg.run(store.get(keys.instance(finance.id)))
    assert instance_codec.attested(record.value) == {"tpm": ak_a}
    # challenges at once, from both replicas and twice from one: each gets its own answer
    at_once = [th.server.replica.attest_later("host-0002") for th in (r0, r1, r0)]
    assert all(f.result(30).attested for f in at_once)

    # ---- a tpm claim on a host nobody enrolled
    e, info = _refusal(r1, rec["host-0001"])
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "E732"
    assert info.metadata["field"] == "deployment.tpm" and "no enrolled attestation key" in e.details()

    # ---- a forged quote: host-0005's agent signs with a TPM that is not the enrolled one
    e, info = _refusal(r0, rec["host-0005"])
    assert info.reason == "E732" and "does not verify with the host's enrolled attestation key" in e.details()
    got = bg.run(store.get(keys.attested_fact("host-0005")))
    refused = AttestedFact.decode(got.key, got.value)
    assert not refused.attested and "does not verify" in refused.why
    assert rec["host-0005"].id not in r0.server.state.registry

    # ---- a replayed quote: host-0006 attests once for real, then its answer is replayed
    genuine = start_agent("host-0006", "d")
    answers: list[bytes] = []

    async def keep_answers() -> None:  # what an eavesdropper on the store sees
        prefix = keys.prefix + "attest/quotes/host-0006/"
        async for ch in store.watch(prefix, (await store.read_prefix(prefix)).revision + 1):
            if ch.value:
                answers.append(ch.value)
    eavesdropper = asyncio.run_coroutine_threadsafe(keep_answers(), bg.loop)
    try:
        r0.server.replica.attest_later("host-0006").result(30)
        eventually(lambda: bool(answers), 10)
    finally:
        eavesdropper.cancel()
    old = answers[0]
    bg.run(genuine.stop())
    fleet["agents"].remove(genuine)
    _register(r0, rec["host-0006"])  # attested a moment ago: accepted
    for th in (r0, r1):
        eventually(lambda th=th: rec["host-0006"].id in th.server.state.registry, 10)

    async def replay() -> None:
        """Answer every challenge for host-0006 with the old quote, its nonce field rewritten."""
        prefix = keys.challenges("host-0006")
        async for ch in store.watch(prefix, (await store.read_prefix(prefix)).revision + 1):
            if ch.value:
                forged = json.loads(old)
                forged["nonce"] = json.loads(ch.value)["nonce"]
                await store.put(keys.quote_answer("host-0006", ch.key[len(prefix):]), json.dumps(forged).encode())
    replayer = asyncio.run_coroutine_threadsafe(replay(), bg.loop)
    try:
        with pytest.raises(AttestationError, match="nonce is not the one issued"):
            r0.server.replica.attest_later("host-0006").result(30)
    finally:
        replayer.cancel()
    for th in (r0, r1):  # its instance is no longer trusted anywhere
        eventually(lambda th=th: rec["host-0006"].id not in th.server.state.registry, 10)
    e, info = _refusal(r1, rec["host-0006"])
    assert info.reason == "E732" and "nonce is not the one issued" in e.details()

    # ---- written straight into etcd, claiming a TPM on an unattested host: not served
    direct = InstanceAgent(store, rec["host-0001"], ttl=5, keys=keys)
    bg.run(direct.start())
    try:
        for th in (r0, r1):
            eventually(lambda th=th: rec["host-0001"].id in th.server.replica._known, 10)
            assert rec["host-0001"].id not in th.server.state.registry
        assert any("does not serve instance" in r.getMessage() and rec["host-0001"].id in r.getMessage() for r in caplog.records)
    finally:
        bg.run(direct.stop())

    # ---- no TPM claimed: no attestation needed
    _register(r0, rec["host-0000"])
    eventually(lambda: rec["host-0000"].id in r1.server.state.registry, 10)

    # ---- what an operator sees: each host's agent, key and attestation
    from policyc.cli.main import main

    assert main(["cluster", "status", "--etcd", *etcd.endpoints, "--etcd-prefix", keys.prefix, "--format", "json"]) == 0
    hosts = {h["host"]: h for h in json.loads(capsys.readouterr().out)["hosts"]}
    assert hosts["host-0002"]["agent"] and hosts["host-0002"]["attested"] and hosts["host-0002"]["enrolled"] == ak_a
    assert not hosts["host-0005"]["attested"] and "does not verify" in hosts["host-0005"]["why"]
    assert not hosts["host-0006"]["attested"] and "nonce is not the one issued" in hosts["host-0006"]["why"]
    assert main(["cluster", "status", "--etcd", *etcd.endpoints, "--etcd-prefix", keys.prefix]) == 0
    text = capsys.readouterr().out
    assert "host-0002        agent up" in text and "tpm attested" in text and "tpm REFUSED: quote signature" in text

    # ---- facts altered after signing: a genuine quote from host-0002's TPM over one set of
    # facts, sent with another (an address added)
    bg.run(agent_a.stop())
    fleet["agents"].remove(agent_a)
    honest = agent_a.facts
    assert honest is not None
    altered = honest.to_json()
    altered["interfaces"] = [*altered["interfaces"], {"name": "evil0", "mac": "", "mtu": 1500, "state": "UP",  # type: ignore[misc]
                                                     "speed_mbps": None, "addresses": ["203.0.113.9/24"]}]

    async def tamper() -> None:
        prefix = keys.challenges("host-0002")
        async for ch in store.watch(prefix, (await store.read_prefix(prefix)).revision + 1):
            if ch.value:
                body = json.loads(ch.value)
                nonce = bytes.fromhex(body["nonce"])
                quote = await asyncio.to_thread(tpms["a"].quote, qualifying_data(nonce, honest.to_json()), (0, 1, 2, 7))
                await store.put(keys.quote_answer("host-0002", ch.key[len(prefix):]), encode_answer(nonce.hex(), quote, altered))
    tamperer = asyncio.run_coroutine_threadsafe(tamper(), bg.loop)
    try:
        with pytest.raises(AttestationError, match="facts altered"):
            r0.server.replica.attest_later("host-0002").result(30)
    finally:
        tamperer.cancel()


def test_an_agent_keeps_its_own_hosts_instances_registered_and_no_other_hosts(fleet, bundle) -> None:  # type: ignore[no-untyped-def]
    keys, bg, store, (r0, r1) = fleet["keys"], fleet["bg"], fleet["store"], fleet["replicas"]
    rec = {i.deployment.host: i for i in admissible_fleet(bundle, r0.server.cluster.gpu_slots(), models=["recommender"])}
    agent = HostAgent(store, keys, "host-0000", None)
    bg.run(agent.start())
    fleet["agents"].append(agent)
    bg.run(agent.keep_registered(rec["host-0000"], ttl=2))
    for th in (r0, r1):
        eventually(lambda th=th: rec["host-0000"].id in th.server.state.registry, 10)
    with pytest.raises(ValueError, match="claims host `host-0003`; this agent is `host-0000`'s"):
        bg.run(agent.keep_registered(rec["host-0003"]))
    bg.run(agent.stop())  # its instances go with it
    fleet["agents"].remove(agent)
    for th in (r0, r1):
        eventually(lambda th=th: rec["host-0000"].id not in th.server.state.registry, 10)
