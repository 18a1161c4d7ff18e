"""Self-heal's execute mode, run for real against stand-in links (a veth pair) in a network namespace
the test makes (never real hardware): the RDMA refresh takes the link down, brings it up and
waits for carrier; a GPU reset on a host without the GPU is refused saying so; rebalance
cordons the node, drains and re-registers its instances elsewhere, step by step; the
operator's switch is the first audit record. Dry run stays the default."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from policyc.audit.query import AuditReader
from policyc.compiler.bundle import Bundle
from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.executor import ActionExecutor, HealTarget
from policyc.enforcer.records import ActionRecord, Outcome
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, EnforcerMode, SelfHeal, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.node_rebalance import NodeRebalance

SMALL = ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4)


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"policyc-heal-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", name)
    try:
        # a veth pair stands in for the RDMA port's device (this kernel has no dummy
        # module): carrier needs both ends up, so "waits for carrier" is a real wait
        sh("ip", "-n", name, "link", "add", "rdma0", "type", "veth", "peer", "name", "rdma0p")
        sh("ip", "-n", name, "link", "set", "rdma0p", "up")
        sh("ip", "-n", name, "link", "set", "rdma0", "up")
        yield name
    finally:
        sh("ip", "netns", "del", name)


def carrier_changes(ns: str) -> int:
    return int(sh("ip", "netns", "exec", ns, "cat", "/sys/class/net/rdma0/carrier_changes").strip())


def test_rdma_refresh_takes_the_link_down_and_brings_it_back_with_carrier(netns: str) -> None:
    audit = MemoryAudit()
    ex = ActionExecutor(audit, rebalance=lambda n: None, allow_real=True)
    before = carrier_changes(netns)
    [r] = ex.run(("rdma_link_refresh",), HealTarget("h/gpu0", "h", "0", "rdma0/1", netns=netns), "collapse")
    assert r.outcome is Outcome.DONE, r.detail
    assert "carrier after" in r.detail
    assert carrier_changes(netns) >= before + 2  # it went down and came back
    assert "state UP" in sh("ip", "-n", netns, "link", "show", "rdma0")
    assert "LOWER_UP" in sh("ip", "-n", netns, "link", "show", "rdma0")
    assert audit.records[-1].outcome is Outcome.DONE and not audit.records[-1].dry_run


def test_a_missing_link_fails_the_step_and_stops_the_rest(netns: str) -> None:
    ex = ActionExecutor(MemoryAudit(), rebalance=lambda n: None, allow_real=True)
    results = ex.run(("rdma_link_refresh", "rebalance"), HealTarget("h/gpu0", "h", "0", "nosuch0/1", netns=netns), "r")
    assert [r.outcome for r in results] == [Outcome.FAILED] and "nosuch0" in results[0].detail


def test_gpu_reset_without_a_gpu_is_refused_and_says_so() -> None:
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this host has a real GPU: the test never resets real hardware")
    ex = ActionExecutor(MemoryAudit(), rebalance=lambda n: None, allow_real=True)
    [r] = ex.run(("gpu_reset",), HealTarget("h/gpu0", "h", "0"), "r")
    assert r.outcome is Outcome.REFUSED and "no NVIDIA GPU 0" in r.detail


def test_dry_run_is_the_default_and_touches_nothing(netns: str) -> None:
    before = carrier_changes(netns)
    [r] = ActionExecutor(MemoryAudit(), rebalance=lambda n: None).run(
        ("rdma_link_refresh",), HealTarget("h/gpu0", "h", "0", "rdma0/1", netns=netns), "r")
    assert r.outcome is Outcome.DRY_RUN and carrier_changes(netns) == before
    assert ServeConfig().self_heal is SelfHeal.DRY_RUN


@pytest.fixture(scope="module")
def served(bundle: Bundle) -> Iterator[tuple[DecisionServer, Path]]:
    log = Path(tempfile.mkdtemp(prefix="policyc-heal-")) / "audit.db"
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE, audit_log=log,
                                                         self_heal=SelfHeal.EXECUTE)))
    th.start()
    yield th.server, log
    th.stop()


def test_the_operators_switch_is_audited(served: tuple[DecisionServer, Path]) -> None:
    _, log = served
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with AuditReader.open(log) as reader:
            if any("switched self-heal to execute" in e.record.detail for e in reader.entries()):  # type: ignore[union-attr]
                return
        time.sleep(0.05)
    raise AssertionError("the execute switch is not in the audit log")


def test_rebalance_cordons_drains_and_re_registers_step_by_step(bundle: Bundle, served: tuple[DecisionServer, Path]) -> None:
    server, _ = served
    assert server.cluster is not None
    slots = server.cluster.gpu_slots()
    host = slots[0].host
    mine = [i for i in admissible_fleet(bundle, slots) if i.deployment.host == host][:2]
    assert mine, "the simulated cluster's first host admits no contract"
    server.engine.register_many(mine)
    in_flight = {"n": 3}

    def calls(endpoints: frozenset[str]) -> int:  # three calls in flight, answered over ~30 ms
        in_flight["n"] = max(0, in_flight["n"] - 1)
        return in_flight["n"]

    audit = MemoryAudit()
    NodeRebalance(server.engine, server.placer, audit, lambda: slots, execute=True, in_flight=calls)(host)
    steps = [(r.detail.split(":")[0], r.outcome) for r in audit.records]
    assert steps[:2] == [("release", Outcome.DONE), ("cordon", Outcome.DONE)]
    regs = {i.id: i for i, _, _ in server.engine.state.registry.entries()}
    assert not any(i.deployment.host == host for i in regs.values())  # nothing is placed there any more
    moved = [r for r in audit.records if r.detail.startswith("re-register")]
    assert len(moved) == len(mine) and all(r.outcome is Outcome.DONE for r in moved), [r.detail for r in moved]
    for inst in mine:
        copy = next(i for i in regs.values() if i.id.endswith(f"#from-{host}") and i.model == inst.model)
        assert copy.deployment.host != host


def test_rebalance_in_dry_run_changes_no_registration(bundle: Bundle, served: tuple[DecisionServer, Path]) -> None:
    server, _ = served
    assert server.cluster is not None
    slots = server.cluster.gpu_slots()
    host = slots[-1].host
    mine = [i for i in admissible_fleet(bundle, slots) if i.deployment.host == host][:1]
    server.engine.register_many(mine)
    audit = MemoryAudit()
    NodeRebalance(server.engine, server.placer, audit, lambda: slots)(host)
    assert all(r.outcome in (Outcome.DONE, Outcome.DRY_RUN) for r in audit.records)
    assert {r.detail.split(":")[0] for r in audit.records if r.dry_run} == {"cordon", "drain", "re-register"}
    assert any(i.id == mine[0].id for i, _, _ in server.engine.state.registry.entries())


def test_a_link_that_never_regains_carrier_fails_the_refresh(netns: str) -> None:
    sh("ip", "-n", netns, "link", "set", "rdma0p", "down")  # the far end is gone: up, but no carrier
    ex = ActionExecutor(MemoryAudit(), rebalance=lambda n: None, allow_real=True, timeout_s=0.3)
    [r] = ex.run(("rdma_link_refresh",), HealTarget("h/gpu0", "h", "0", "rdma0/1", netns=netns), "r")
    assert r.outcome is Outcome.FAILED and "no carrier after 0.3 s" in r.detail


def test_rebalance_drain_waits_for_the_gateways_in_flight_picks(bundle: Bundle) -> None:
    """`policyc gateway` links self-heal's rebalance to its picker: the drain step waits for a
    call really in flight through Envoy to the node's model server, and ends when it answers."""
    import threading

    from evidence_support import EvidenceRig
    from gateway_rig import PRIMARY
    from test_gateway_accounting import BASE, IDS

    from policyc.modelserver.client import OipClient

    rig = EvidenceRig(bundle, Path(tempfile.mkdtemp(prefix="policyc-drain-")))
    try:
        g = rig.thread.server.guardian
        assert g is not None
        hook = g.executor.rebalance
        assert isinstance(hook, NodeRebalance)
        said: list[ActionRecord] = []
        hook.audit = said.append
        [slot] = [s for s in rig.slots if s.model == PRIMARY]
        endpoint = frozenset({rig.models.endpoint(slot.instance_id)})
        answer: list[object] = []
        with OipClient(rig.listen) as client:
            def infer() -> None:  # stalled on the primary: broken at its budget, answered by the backup
                answer.append(client.infer(PRIMARY, IDS, metadata=BASE + (("x-policyc-stall-ms", "400"),), timeout=10))
                answer.append(time.monotonic())

            call = threading.Thread(target=infer)
            t0 = time.monotonic()
            call.start()
            while hook._in_flight(endpoint) == 0 and time.monotonic() - t0 < 5:
                time.sleep(0.005)
            assert hook._in_flight(endpoint) == 1  # the gateway's pick, seen by the rebalance hook
            hook._drain(slot.instance.deployment.host, endpoint)
            drained = time.monotonic() - t0
            call.join(10)
        assert len(answer) == 2 and hook._in_flight(endpoint) == 0
        answered = answer[1] - t0  # type: ignore[operator]
        [rec] = [r for r in said if r.detail.startswith("drain:")]
        assert rec.outcome is Outcome.DONE and "1 call(s) in flight answered" in rec.detail, rec.detail
        # it waited for the call: the drain ended when the request did (its ext_proc stream ends
        # with it, about when the client has the answer)
        assert drained >= answered - 0.02, (drained, answered)
        print(f"\ndrain waited {drained * 1e3:.0f} ms, the call answered after {answered * 1e3:.0f} ms")
        rig.gateway.stop()
        assert hook._in_flight(endpoint) == 0 and not hook._sources  # unlinked at stop
    finally:
        rig.stop()
