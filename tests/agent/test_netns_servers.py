"""The agent's supervised model server on the namespace fleet: `policyc agent run --servers`
inside a host's namespace starts the server there pinned (its affinity read from the
kernel), registers its instance with the endpoint on that host's own address, and the
replica in the root namespace serves it (a Decide places on it); a crash takes the instance
out of the replica's registry until the agent has started the server again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from agent_rig import eventually, new_prefix, replica

from policyc.cluster.local_etcd import LocalEtcd
from policyc.cluster.netns_fleet import NetnsFleet
from policyc.cluster.server_pinning import read_affinity
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

HOSTS = ("host-0002", "host-0005")
B = "host-0005"
POLICYC = [sys.executable, "-m", "policyc.cli.main"]


@pytest.fixture(scope="module")
def fleet() -> Iterator[NetnsFleet]:
    f = NetnsFleet.create(HOSTS)
    try:
        yield f
    finally:
        f.destroy()


@pytest.fixture(scope="module")
def fleet_etcd(fleet: NetnsFleet) -> Iterator[LocalEtcd]:
    etcd = LocalEtcd.start(1, also_listen=fleet.gateway)
    yield etcd
    etcd.stop()


def _server_pid(agent_pid: int) -> int | None:
    """The agent's child (it starts servers from a worker thread: every thread's children)."""
    for t in Path(f"/proc/{agent_pid}/task").iterdir():
        try:
            kids = (t / "children").read_text().split()
        except OSError:
            continue
        if kids:
            return int(kids[0])
    return None


def test_a_supervised_server_on_a_namespace_host_is_registered_on_its_address_and_served(bundle, fleet, fleet_etcd,
                                                                                        tmp_path) -> None:  # type: ignore[no-untyped-def]
    prefix = new_prefix()
    r0 = replica(bundle, fleet_etcd, "r0", prefix)
    url = f"http://{fleet.gateway}:{fleet_etcd.members[0].client_port}"
    addr = fleet.hosts[B].address
    inst = next(i for i in admissible_fleet(bundle, r0.server.cluster.gpu_slots(), models=["recommender"])
                if i.deployment.host == B)
    body = inst.model_dump(mode="json")
    body["deployment"]["endpoint"] = f"{addr}:8000"
    spec = tmp_path / "servers.json"
    spec.write_text(json.dumps([{"name": "rec-0", "numa_node": 0, "cpus": "0", "instance": body,
                                 "argv": [sys.executable, "-m", "http.server", "8000", "--bind", addr]}]))
    agent = fleet.popen(B, [*POLICYC, "agent", "run", "--host", B, "--etcd", url, "--etcd-prefix", prefix, "--signal-period", "0",
                            "--lease-ttl", "30", "--servers", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert f"host {B} ready" in line, line + (agent.stderr.read() if agent.poll() is not None and agent.stderr else "")
        registry = r0.server.state.registry
        eventually(lambda: inst.id in registry and _server_pid(agent.pid) is not None, 30, step=0.05)
        first = _server_pid(agent.pid)
        assert first is not None and read_affinity(first)[0] == (0,)
        with grpc.insecure_channel(f"127.0.0.1:{r0.server.port}") as ch:
            d = pb_grpc.DecisionsStub(ch).Decide(pb.DecideRequest(headers={"X-Model": "recommender"}), timeout=30)
        assert d.outcome == pb.ADMITTED and d.placement.instance_id == inst.id and d.placement.endpoint == f"{addr}:8000", d

        os.kill(first, signal.SIGKILL)  # the server crashes: out of the registry, then back once started again
        eventually(lambda: inst.id not in registry, 30, step=0.02)
        eventually(lambda: inst.id in registry and _server_pid(agent.pid) not in (None, first), 30, step=0.05)
        again = _server_pid(agent.pid)
        assert again is not None and read_affinity(again)[0] == (0,)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
        r0.stop()
