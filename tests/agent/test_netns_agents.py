"""Host agents in network namespaces (three hosts joined by a bridge, each agent a real
`policyc agent run` process inside its host): what each reports is its namespace's real
interfaces and addresses, as `ip` sees them; the replica takes the addresses as the host's,
so an instance claiming one host with an endpoint on another host's address is refused
(rule `not-the-claimed-host`), and one on its own host's address is accepted."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from typing import Iterator

import grpc
import pytest
from agent_rig import eventually, new_prefix, replica
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from policyc.cluster.local_etcd import LocalEtcd
from policyc.cluster.netns_fleet import NetnsFleet
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

HOSTS = ("host-0002", "host-0005", "host-0006")


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


def _real(fleet: NetnsFleet, host: str) -> dict[str, tuple[str, set[str]]]:
    """interface → (MAC, addresses as CIDR), from `ip -j addr` inside the host."""
    out = fleet.run(host, ["ip", "-j", "addr"], capture_output=True, text=True, timeout=20)
    return {i["ifname"].split("@")[0]: (i.get("address", ""), {f"{a['local']}/{a['prefixlen']}" for a in i.get("addr_info", [])})
            for i in json.loads(out.stdout)}


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
    agents = {h: nsfleet.popen(h, [sys.executable, "-m", "policyc.cli.main", "agent", "run", "--host", h, "--etcd", etcd_url,
                                   "--etcd-prefix", prefix], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for h in HOSTS}
    try:
        for h, p in agents.items():
            assert p.stdout is not None
            line = p.stdout.readline()
            assert f"host {h} ready" in line, line + (p.stderr.read() if p.poll() is not None and p.stderr else "")
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
        for p in agents.values():
            p.terminate()
        for p in agents.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        r0.stop()
