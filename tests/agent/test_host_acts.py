"""Acts on the host they concern, on the namespace fleet (three hosts, each with a real
`policyc agent run`; etcd and the leader replica in the root namespace):

- a link failure on host B (its data veth taken down in B's namespace) is healed by B's
  agent, started by B's agent's own report: B's agent measures the link down, the fenced
  leader plans the heal for B (`cluster/link_heal.py`) and sends the step through etcd with
  its fencing token, B's agent takes the link down and up there (the link is up again in B's
  namespace; the decision service's namespace has no such device), and the audit shows the
  report, the sent step and B's result, each with the host and the fencing token;
- dry run stays the default: the agent answers with what it would do, the link stays down,
  and the heal is planned once per failure (not again every tick);
- an order under a deposed leader's fencing token is refused by the agent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Iterator

import pytest
from agent_rig import eventually, new_prefix, replica

from policyc.cluster.host_acts import Order
from policyc.cluster.local_etcd import LocalEtcd
from policyc.cluster.netns_fleet import NetnsFleet
from policyc.cluster.link_heal import RULE
from policyc.enforcer.records import ActionKind, Outcome

HOSTS = ("host-0002", "host-0005", "host-0006")
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


def _ip(*args: str) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _state(fleet: NetnsFleet, host: str) -> str:
    got = json.loads(_ip("-n", fleet.hosts[host].netns, "-j", "link", "show", "data0"))[0]
    return "UP" if "UP" in got["flags"] else "DOWN"


def test_a_link_failure_on_host_b_is_healed_by_bs_agent_under_the_fencing_token(bundle, fleet, fleet_etcd) -> None:  # type: ignore[no-untyped-def]
    prefix = new_prefix()
    r0 = replica(bundle, fleet_etcd, "r0", prefix)
    url = f"http://{fleet.gateway}:{fleet_etcd.members[0].client_port}"
    peer = fleet.add_link(B)
    agents = {h: fleet.popen(h, [*POLICYC, "agent", "run", "--host", h, "--etcd", url, "--etcd-prefix", prefix],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for h in HOSTS}
    try:
        for h, p in agents.items():
            assert p.stdout is not None
            line = p.stdout.readline()
            assert f"host {h} ready" in line, line + (p.stderr.read() if p.poll() is not None and p.stderr else "")
        rep = r0.server.replica
        eventually(lambda: set(rep.host_facts) == set(HOSTS) and rep.election.token != 0, 30, step=0.1)
        token = rep.election.token
        assert r0.server.guardian is not None and r0.server.actions is not None
        executor = r0.server.guardian.executor
        records = r0.server.actions.memory.records
        book = rep.host_signals
        assert subprocess.run(["ip", "link", "show", "data0"], capture_output=True, timeout=20).returncode != 0  # not here

        # the link fails on B; B's agent measures it down and reports it; the leader plans the heal for B
        _ip("-n", fleet.hosts[B].netns, "link", "set", "data0", "down")
        eventually(lambda: any(r.rule == RULE and r.target == f"{B}/data0" for r in records), 30, step=0.05)
        planned = next(r for r in records if r.rule == RULE)
        assert planned.kind is ActionKind.REPORT_ANOMALY and planned.source == "replica r0" and planned.dry_run
        assert f"host {B}'s agent measured data0 down (operstate)" in planned.detail
        assert f"on {B}'s agent under fencing token {token} (dry run)" in planned.detail
        assert book.reports[B].interfaces["data0"]["up"] == 0.0

        # dry run (the default): sent, answered with what would be done, the link stays down
        assert executor.allow_real is False
        eventually(lambda: any(r.source == f"agent {B}" and r.outcome is Outcome.DRY_RUN for r in records), 20, step=0.05)
        sent = next(r for r in records if r.source == "executor" and r.rule == RULE)
        assert sent.outcome is Outcome.OBSERVED and f"sent to {B}'s agent" in sent.detail and f"fencing token {token}" in sent.detail
        assert sent.target == f"rdma_link_refresh {B}/data0"
        dry = next(r for r in records if r.source == f"agent {B}")
        assert dry.dry_run and "would take data0 down and up" in dry.detail and f"fencing token {token}" in dry.detail
        time.sleep(1.0)  # five more reports of the link down: planned once for this failure
        assert _state(fleet, B) == "DOWN" and rep.link_heal.planned == [(B, "data0", token)]

        # executed (the operator's --self-heal execute): the next plan for the link still down is carried out by B's agent
        executor.allow_real = True
        rep.link_heal.retry_s = 0.0
        eventually(lambda: len(rep.link_heal.planned) >= 2, 30, step=0.02)
        rep.link_heal.retry_s = 60.0
        eventually(lambda: any(r.source == f"agent {B}" and r.outcome is Outcome.DONE for r in records), 30, step=0.05)
        eventually(lambda: set(rep.acts.sent) <= set(rep.acts.results), 30, step=0.05)  # no order still under way
        done = next(r for r in records if r.source == f"agent {B}" and r.outcome is Outcome.DONE)
        assert done.target == f"link_refresh {B}/data0" and f"on host {B} by its agent under fencing token {token}" in done.detail
        assert "data0 down" in done.detail and "carrier after" in done.detail
        assert _state(fleet, B) == "UP"  # observed in B's namespace
        eventually(lambda: book.reports[B].interfaces.get("data0", {}).get("up") == 1.0, 20, step=0.05)  # and measured so
        steps = [r for r in records if r.rule == RULE]
        assert steps and all(f"fencing token {token}" in r.detail and B in r.detail + r.target for r in steps)
        executor.allow_real = False

        # a deposed leader's order: refused by the agent, the link untouched
        _ip("-n", fleet.hosts[B].netns, "link", "set", "data0", "down")
        stale = Order("deposed-1", B, "link_refresh", "data0", False, token - 1, "r-old", "link-flap", time.time())
        out = subprocess.run(["etcdctl", "--endpoints", fleet_etcd.endpoints[0], "put", f"{prefix}host_acts/{B}/deposed-1"],
                             input=stale.encode().decode(), capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        eventually(lambda: "deposed-1" in rep.acts.results, 20, step=0.05)
        answer = rep.acts.results["deposed-1"]
        assert answer["outcome"] == "refused" and f"fencing token {token - 1} of r-old does not hold" in answer["detail"]
        assert f"r0 leads under fencing token {token}" in answer["detail"]
        time.sleep(0.5)
        assert _state(fleet, B) == "DOWN"
    finally:
        for p in agents.values():
            if p.poll() is None:
                p.terminate()
        for p in agents.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["ip", "link", "del", peer], capture_output=True, timeout=20)
        r0.stop()
