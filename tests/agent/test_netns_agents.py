"""Host agents in network namespaces (three hosts joined by a bridge, each with its own
software TPM and a real `policyc agent run` process inside it, etcd and the replica in the
root namespace):

- what each agent reports is its namespace's real interfaces and addresses, as `ip` sees
  them; the replica takes the addresses as the host's, so an instance claiming one host
  with an endpoint on another host's address is refused (rule `not-the-claimed-host`);
- keys made inside each host and enrolled by the operator: an instance on an attested host
  is accepted, a TPM claim on a host without an enrolled key, a quote from a host whose
  agent's TPM is not the enrolled one (forged), and an old quote replayed to a new challenge
  are refused."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from agent_rig import eventually, new_prefix, replica
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from policyc.cluster import instance_codec
from policyc.cluster.etcd_store import EtcdStore
from policyc.cluster.host_hardware import Hardware, Site, discover_hardware
from policyc.cluster.signed_reports import ReportKey
from policyc.cluster.keys import Keys
from policyc.cluster.local_etcd import LocalEtcd
from policyc.cluster.local_tpm import SoftwareTpm
from policyc.cluster.netns_fleet import NetnsFleet
from policyc.cluster.tpm_quote import AttestationError, AttestationKey
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

HOSTS = ("host-0002", "host-0005", "host-0006")
POLICYC = [sys.executable, "-m", "policyc.cli.main"]


@pytest.fixture(scope="module")
def nsfleet() -> Iterator[NetnsFleet]:
    fleet = NetnsFleet.create(HOSTS)
    try:
        yield fleet
    finally:
        fleet.destroy()


@pytest.fixture(scope="module")
def bridged_etcd(nsfleet: NetnsFleet) -> Iterator[LocalEtcd]:
    etcd = LocalEtcd.start(1, also_listen=nsfleet.gateway)
    yield etcd
    etcd.stop()


@pytest.fixture(scope="module")
def ns_tpms(nsfleet: NetnsFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SoftwareTpm]]:
    """One software TPM inside each host, on that host's own loopback."""
    root = tmp_path_factory.mktemp("ns-tpms")
    started: dict[str, SoftwareTpm] = {}
    try:
        for h in HOSTS:
            started[h] = SoftwareTpm.start(root, netns=nsfleet.hosts[h].netns)
        yield started
    finally:
        for t in started.values():
            t.stop()


def _agents(fleet: NetnsFleet, etcd_url: str, prefix: str, tpms: dict[str, SoftwareTpm] | None = None,
            state: Path | None = None, site: dict[str, list[str]] | None = None) -> dict[str, "subprocess.Popen[str]"]:
    out = {}
    for h in HOSTS:
        argv = [*POLICYC, "agent", "run", "--host", h, "--etcd", etcd_url, "--etcd-prefix", prefix, *(site or {}).get(h, [])]
        if tpms is not None and state is not None:
            argv += ["--tcti", tpms[h].tcti, "--state-dir", str(state / h)]
        out[h] = fleet.popen(h, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for h, p in out.items():
        assert p.stdout is not None
        line = p.stdout.readline()
        assert f"host {h} ready" in line, line + (p.stderr.read() if p.poll() is not None and p.stderr else "")
    return out


def _stop(agents: dict[str, "subprocess.Popen[str]"]) -> None:
    for p in agents.values():
        if p.poll() is None:
            p.terminate()
    for p in agents.values():
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def _real(fleet: NetnsFleet, host: str) -> dict[str, tuple[str, set[str]]]:
    """interface → (MAC, addresses as CIDR), from `ip -j addr` inside the host."""
    out = fleet.run(host, ["ip", "-j", "addr"], capture_output=True, text=True, timeout=20)
    return {i["ifname"].split("@")[0]: (i.get("address", ""), {f"{a['local']}/{a['prefixlen']}" for a in i.get("addr_info", [])})
            for i in json.loads(out.stdout)}


def _this_machine(host: str) -> Hardware:
    """What an agent on this machine reads of its hardware (no site facts given)."""
    return discover_hardware(Site())


def _register(th, inst, endpoint: str):  # type: ignore[no-untyped-def]
    dep = {k: v for k, v in inst.deployment.model_dump().items() if k in pb.Deployment.DESCRIPTOR.fields_by_name}
    dep["endpoint"] = endpoint
    with grpc.insecure_channel(f"127.0.0.1:{th.server.port}") as ch:
        return pb_grpc.DecisionsStub(ch).RegisterInstance(
            pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep)), timeout=60)


def test_agents_report_their_namespaces_and_an_endpoint_on_another_hosts_address_is_refused(bundle, nsfleet, bridged_etcd) -> None:  # type: ignore[no-untyped-def]
    prefix = new_prefix()
    r0 = replica(bundle, bridged_etcd, "r0", prefix)
    etcd_url = f"http://{nsfleet.gateway}:{bridged_etcd.members[0].client_port}"
    agents = _agents(nsfleet, etcd_url, prefix)
    try:
        seen = r0.server.replica.host_facts

        def matches(h: str) -> bool:
            f = seen.get(h)
            return f is not None and {i.name: (i.mac, set(i.addresses)) for i in f.interfaces} == _real(nsfleet, h)
        for h in HOSTS:  # exactly the namespace's interfaces, MACs and addresses (IPv6 link-local included, once it is up)
            eventually(lambda h=h: matches(h), 30, step=0.2)
            facts = seen[h]
            assert {i.name for i in facts.interfaces} == {"lo", "eth0"}
            assert facts.routable() == {nsfleet.hosts[h].address}
            eth0 = next(i for i in facts.interfaces if i.name == "eth0")
            assert eth0.state == "UP" and ipaddress.ip_interface(f"{nsfleet.hosts[h].address}/24") in \
                {ipaddress.ip_interface(a) for a in eth0.addresses}
            # its hardware as the kernel lists it (the hosts share this machine's /sys), each fact with its source
            assert facts.hardware is not None and facts.hardware == _this_machine(h)

        slots = r0.server.cluster.gpu_slots()
        finance = [i for i in admissible_fleet(bundle, slots, models=["fraud-scorer"]) if i.deployment.host == "host-0002"]
        rec = {i.deployment.host: i for i in admissible_fleet(bundle, slots, models=["recommender"])}
        own, other = nsfleet.hosts["host-0002"].address, nsfleet.hosts["host-0005"].address
        _register(r0, finance[0], f"{own}:8000")  # its own host's address: accepted
        assert finance[0].id in r0.server.state.registry
        with pytest.raises(grpc.RpcError) as err:  # host-0002's facts, host-0005's address
            _register(r0, finance[1], f"{other}:8000")
        e = err.value
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
        st = rpc_status.from_call(e)  # type: ignore[arg-type]
        assert st is not None
        info = error_details_pb2.ErrorInfo()
        next(d for d in st.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)).Unpack(info)
        assert info.metadata["rule"] == "not-the-claimed-host" and "is host `host-0005`'s, not `host-0002`'s" in e.details()
        assert finance[1].id not in r0.server.state.registry
        _register(r0, rec["host-0005"], f"{other}:8000")  # host-0005's instance on host-0005's address: accepted
    finally:
        _stop(agents)
        r0.stop()


def _refusal(th, inst, endpoint: str) -> tuple[str, error_details_pb2.ErrorInfo]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        _register(th, inst, endpoint)
    st = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    assert st is not None
    info = error_details_pb2.ErrorInfo()
    next(d for d in st.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)).Unpack(info)
    return err.value.details(), info  # type: ignore[attr-defined]


def test_tpm_facts_on_the_namespace_fleet_attested_forged_replayed_and_unenrolled(bundle, nsfleet, bridged_etcd, ns_tpms,
                                                                                   tmp_path) -> None:  # type: ignore[no-untyped-def]
    prefix = new_prefix()
    keys = Keys(prefix)
    etcd_url = f"http://{nsfleet.gateway}:{bridged_etcd.members[0].client_port}"
    store_flags = ["--etcd", etcd_url, "--etcd-prefix", prefix]
    ak = {}
    for h in HOSTS:  # each host makes its key in its own TPM; the files reach the operator
        out = nsfleet.run(h, [*POLICYC, "agent", "key", "--tcti", ns_tpms[h].tcti, "--state-dir", str(tmp_path / h),
                              "--out", str(tmp_path / f"{h}.ak")], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        ak[h] = tmp_path / f"{h}.ak"
    # the operator enrolls host-0002 with its key, host-0006 with host-0005's (the agent there will quote with its own
    # TPM: a forged quote), and does not enroll host-0005 at all
    for h, key_of in (("host-0002", "host-0002"), ("host-0006", "host-0005")):
        out = subprocess.run([*POLICYC, "agent", "enroll", "--host", h, "--ak", str(ak[key_of]), "--pcrs", "sha256:0,1,2,7",
                              *store_flags], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    r0 = replica(bundle, bridged_etcd, "r0", prefix)
    # host-0002's operator gives its site facts (as the simulated host-0002 has them)
    agents = _agents(nsfleet, etcd_url, prefix, ns_tpms, tmp_path,
                     site={"host-0002": ["--region", "us-west", "--hardware-firewall", "true"]})
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)
    store = EtcdStore(bridged_etcd.endpoints)
    run(store.connect())
    try:
        eventually(lambda: len(r0.server.replica.attestation.enrolled) == 2 and len(r0.server.replica.host_facts) == 3, 15)
        slots = r0.server.cluster.gpu_slots()
        finance = [i for i in admissible_fleet(bundle, slots, models=["fraud-scorer"]) if i.deployment.host == "host-0002"][0]
        rec = {i.deployment.host: i for i in admissible_fleet(bundle, slots, models=["recommender"])}
        addr = {h: nsfleet.hosts[h].address for h in HOSTS}

        # the leader attests an enrolled host as soon as its agent reports; the addresses it
        # signed are then the host's for the endpoint rules
        eventually(lambda: r0.server.replica.attestation.attested("host-0002") is not None, 20)
        assert r0.server.replica.attestation.attested("host-0002").addresses == (addr["host-0002"],)
        # its hardware facts as its quote signed them (and, TPM given by --tcti, a TPM among them): claims on host-0002
        # are judged by these, not by the unsigned report
        signed = Hardware.from_json(r0.server.replica.attestation.attested("host-0002").hardware)
        assert "tpm" in signed.security and "--tcti" in signed.sources["security.tpm"]
        assert signed.numa == _this_machine("host-0002").numa and r0.server.replica.reports_facts("host-0002")
        assert signed.site == Site("us-west", None, True)

        # its signal reports are signed with the report key its quote signed, and merged only so: an unsigned one, one
        # signed with another key and a replayed old one are refused; host-0006 (its quote refused) has none merged;
        # host-0005 (not enrolled) is merged on its agent's word
        book = r0.server.replica.host_signals
        assert r0.server.replica.attestation.attested("host-0002").report_key == r0.server.replica.host_facts["host-0002"].report_key
        eventually(lambda: book.verified.get("host-0002", 0) >= 3 and "host-0005" in book.reports, 20)
        old_report = run(store.get(keys.signal("host-0002"))).value
        genuine = json.loads(old_report[:old_report.rfind(b',"sig":"')] + b"}")
        for raw, why in ((json.dumps(genuine).encode(), "unsigned"),
                         (ReportKey().sign(json.dumps({**genuine, "time": time.time() + 5}, separators=(",", ":")).encode()),
                          "does not verify with the report key of the host's last verified quote"),
                         (old_report, "a replayed report")):
            before = book.rejected.get("host-0002", 0)
            eventually(lambda: book.verified.get("host-0002", 0) >= 1 and book.reports["host-0002"].time > genuine["time"], 10)
            run(store.put(keys.signal("host-0002"), raw))
            eventually(lambda before=before: book.rejected.get("host-0002", 0) > before, 10)  # type: ignore[misc]
            assert why in book.last_refusal["host-0002"], book.last_refusal
        assert "host-0006" not in book.reports and "no verified quote" in book.last_refusal["host-0006"]
        # attested host, own address: accepted, the record names the key that attested it
        _register(r0, finance, f"{addr['host-0002']}:8000")
        record = run(store.get(keys.instance(finance.id)))
        name = AttestationKey.parse(ak["host-0002"].read_bytes()).name.hex()  # and the site facts its quote signed
        assert instance_codec.attested(record.value) == {"tpm": name, "region": name, "hardware_firewall": name}
        # a TPM claim on a host without an enrolled key
        why, info = _refusal(r0, rec["host-0005"], f"{addr['host-0005']}:8000")
        assert info.reason == "E732" and "no enrolled attestation key" in why
        # host-0006 answers with a TPM other than the enrolled one: its TPM claim is refused, and
        # the address its agent reports is not taken as host-0006's (enrolled: only signed addresses count)
        why, info = _refusal(r0, rec["host-0006"], "")
        assert info.reason == "E732" and "does not verify with the host's enrolled attestation key" in why
        why, info = _refusal(r0, rec["host-0006"], f"{addr['host-0006']}:8000")
        assert info.reason == "E725" and info.metadata["rule"] == "outside-allowed-networks", why  # no host's, as far as we know

        # replay: an answer host-0002 gave once, replayed after its agent is gone
        answers: list[bytes] = []
        watching = threading.Event()  # each spy below watches before the challenge it must see can be issued

        async def eavesdrop() -> None:
            p = keys.prefix + "attest/quotes/host-0002/"
            snap = await store.read_prefix(p)
            answers.extend(e.value for e in snap.entries if e.value)
            watching.set()
            async for ch in store.watch(p, snap.revision + 1):
                if ch.value:
                    answers.append(ch.value)
        spy = asyncio.run_coroutine_threadsafe(eavesdrop(), loop)
        assert watching.wait(30)
        r0.server.replica.attest_later("host-0002").result(30)
        eventually(lambda: bool(answers), 10)
        spy.cancel()
        agents["host-0002"].terminate()
        agents["host-0002"].wait(20)

        async def replay() -> None:
            p = keys.challenges("host-0002")

            async def answer(key: str, value: bytes) -> None:
                forged = json.loads(answers[0])
                forged["nonce"] = json.loads(value)["nonce"]
                await store.put(keys.quote_answer("host-0002", key[len(p):]), json.dumps(forged).encode())
            snap = await store.read_prefix(p)  # a challenge already open (an attestation in flight) is answered too
            watching.set()
            for e in snap.entries:
                await answer(e.key, e.value)
            async for ch in store.watch(p, snap.revision + 1):
                if ch.value:
                    await answer(ch.key, ch.value)
        watching.clear()
        replayer = asyncio.run_coroutine_threadsafe(replay(), loop)
        assert watching.wait(30)
        try:
            with pytest.raises(AttestationError, match="nonce is not the one issued"):
                r0.server.replica.attest_later("host-0002").result(30)
        finally:
            replayer.cancel()
        eventually(lambda: finance.id not in r0.server.state.registry, 10)  # no longer trusted
    finally:
        _stop(agents)
        run(store.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        r0.stop()
