"""The embedded default (one process, no etcd) runs the agent for its own host in process:
with `--telemetry local` the host's facts and measured signals reach the replica through
its local store as any host agent's do, and the placer's frame carries them (the port's
figures under its port key, the agent's own period under the host). With the simulator
there is no local host in the fleet, and no agent."""

from __future__ import annotations

import os
import time

from cluster_rig import SMALL

from policyc.cluster.config import FleetConfig
from policyc.cluster.host_facts import discover, uplinks
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import EnforcerMode, ServeConfig, Telemetry


def _wait(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.05)


def test_the_embedded_default_runs_an_agent_for_its_own_host(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    th = ServerThread(DecisionServer(bundle, ServeConfig(telemetry=Telemetry.LOCAL, enforcer=EnforcerMode.USERSPACE,
                                                         watch_gpus=False, fleet=FleetConfig(state_dir=tmp_path / "s", name="solo"))))
    th.start()
    try:
        replica = th.server.replica
        assert replica is not None
        me = os.uname().nodename
        _wait(lambda: me in replica.host_facts and me in replica.host_signals.reports, 30, "the local agent's facts and signals")
        real = discover(me)
        ups = uplinks(real)  # its uplinks as the kernel has them (other tests may add veths meanwhile: not compared)
        assert ups

        def same_uplinks() -> bool:
            seen = {i.name: set(i.addresses) for i in replica.host_facts[me].interfaces}
            return all(seen.get(i.name) == set(i.addresses) for i in real.interfaces if i.name in ups)
        _wait(same_uplinks, 30, "the agent's facts naming the host's uplinks and their addresses")
        t = th.server.refresher.source.topology()
        ports = [t.port_key(p) for p in range(len(t.ports)) if t.hosts[t.ports[p].host].name == me]
        assert ports, "the local topology has this host's NICs as ports"

        def in_frame() -> bool:
            m = th.server.refresher.current().frame.measured
            return me in m and "agent.period_s" in m[me].values and all(p in m for p in ports)
        _wait(in_frame, 30, "the agent's readings in the placer's frame")
        m = th.server.refresher.current().frame.measured
        assert m[me].values["agent.period_s"] == 0.2 and m[me].age_s < 30
        assert all("port_up" in m[p].values for p in ports)
    finally:
        th.stop()
    assert replica.local_agent is None  # stopped with the replica


def test_a_simulated_fleet_has_no_local_agent(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE, watch_gpus=False,
                                                         fleet=FleetConfig(state_dir=tmp_path / "s", name="solo"))))
    th.start()
    try:
        assert th.server.replica is not None and th.server.replica.local_agent is None
    finally:
        th.stop()
