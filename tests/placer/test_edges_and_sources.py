"""Refusals never raise; sources report what they cannot see."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from placer_support import contract, instances

from policyc.compiler.bundle import GpuShare
from policyc.placer import Constraint, LocalHostSource, NoPlacement, NvmlSource, PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.localhost import parse_cpulist
from policyc.placer.nvml import gpu_class


@pytest.mark.parametrize("budget", [0.0, -1.0, math.nan, math.inf, "200ms"])
def test_bad_budget_is_a_refusal_not_an_exception(sim: SimulatedCluster, budget: object) -> None:
    r = Refresher(sim)
    out = Placer(r).place(instances(sim), budget, contract())  # type: ignore[arg-type]
    assert isinstance(out, NoPlacement) and out.binding is Constraint.INPUT and "budget" in out.message


def test_tiny_budget_names_the_latency_budget(sim: SimulatedCluster) -> None:
    out = Placer(Refresher(sim)).place(instances(sim), 0.001, contract())
    assert isinstance(out, NoPlacement) and out.binding is Constraint.LATENCY_BUDGET
    assert "predicts" in out.message and out.rejected


def test_no_candidates_and_unknown_ingress(sim: SimulatedCluster) -> None:
    p = Placer(Refresher(sim))
    assert p.place([], 0.2, contract()).binding is Constraint.NO_CANDIDATES  # type: ignore[union-attr]
    out = p.place(instances(sim), 0.2, contract(), ingress="ingress/mars")
    assert isinstance(out, NoPlacement) and "ingress/mars" in out.message


def test_solver_shares_are_used_and_an_infeasible_class_is_rejected(sim: SimulatedCluster) -> None:
    classes = {s.gpu_model for s in sim.gpu_slots()}
    shares = tuple(GpuShare(gpu=c, feasible=(c == "H100"), min_share=0.05 if c == "H100" else None,
                            binding="compute", detail="test") for c in classes)
    out = Placer(Refresher(sim)).place(instances(sim), 0.2, contract(gpu_shares=shares))
    if "H100" in classes:
        assert isinstance(out, PlacementPlan) and out.gpu_model == "H100" and out.share == 0.05
        assert out.share_source.value == "solver"
    assert all(x.constraint is Constraint.GPU_CLASS for x in out.rejected)


def test_anomaly_reports_lower_health_on_the_next_tick(sim: SimulatedCluster) -> None:
    r = Refresher(sim)
    p = Placer(r)
    r.tick()
    first = p.place(instances(sim), 0.2, contract())
    assert isinstance(first, PlacementPlan)
    assert p.report_anomaly(first.gpu_key, "sm_util", 0.15) and p.report_anomaly((first.host, first.gpu), "sm_util", 0.1)
    assert not p.report_anomaly("nohost/gpu9", "sm_util", 0.1)
    r.tick()
    again = p.place(instances(sim), 0.2, contract())
    assert isinstance(again, PlacementPlan) and again.gpu_key != first.gpu_key


def test_port_down_uses_the_other_numa_port_then_refuses(sim: SimulatedCluster) -> None:
    key = "host-0000/gpu0"
    r = Refresher(sim)
    p = Placer(r)
    sim.link_down("host-0000/mlx5_0")
    r.tick()
    plan = p.place(instances(sim, keys=[key]), 0.2, contract())
    assert isinstance(plan, PlacementPlan) and plan.rdma_port == "host-0000/mlx5_1"
    sim.link_down("host-0000/mlx5_1")
    r.tick()
    out = p.place(instances(sim, keys=[key]), 0.2, contract())
    assert isinstance(out, NoPlacement) and out.binding is Constraint.PORT and "down" in out.message


def test_simulator_is_deterministic_and_checks_event_targets() -> None:
    a, b = SimulatedCluster(9, 40), SimulatedCluster(9, 40)
    assert a.gpu_slots() == b.gpu_slots()
    assert (a.sample().gpu_sm_util == b.sample().gpu_sm_util).all()
    assert {s.region for s in a.gpu_slots()} <= {"us-west", "us-east", "eu-west", "eu-central"}
    with pytest.raises(ValueError, match="unknown"):
        a.watermark("nohost/mlx5_0", 0.89)
    with pytest.raises(ValueError, match="fraction"):
        a.watermark("host-0000/mlx5_0", 1.5)


def test_refresher_thread_measures_itself(sim: SimulatedCluster) -> None:
    import time

    with Refresher(sim, interval=0.05) as r:
        time.sleep(0.4)
    lat = r.latencies()
    assert len(lat) >= 3 and all(0 < x < 0.05 for x in lat)
    assert r.current().version == len(lat)


def test_nvml_absent_reports_nothing_and_says_so() -> None:
    assert gpu_class("NVIDIA H100 80GB HBM3") == "H100" and gpu_class("NVIDIA A100-SXM4-40GB") == "A100-40G"
    n = NvmlSource()
    if n.available:
        pytest.skip("an NVIDIA GPU is present: this test is of the machine without one")
    assert n.reason.startswith("no NVIDIA GPU / NVML unavailable") and n.readings() == ()


def test_local_host_source_reads_a_sysfs_tree(tmp_path: Path) -> None:
    def w(rel: str, text: str) -> None:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    w("devices/system/node/node0/cpulist", "0-3,8")
    w("devices/system/node/node0/meminfo", "Node 0 MemFree:  1024 kB\n")
    w("devices/system/node/node1/cpulist", "4-7")
    w("class/net/eth0/device/numa_node", "1")
    w("class/net/eth0/speed", "100000")
    w("class/net/eth0/operstate", "up")
    w("class/net/eth0/statistics/rx_bytes", "0")
    w("class/net/eth0/statistics/tx_bytes", "0")
    w("class/infiniband/mlx5_0/device/numa_node", "0")
    w("class/infiniband/mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)")
    w("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE")
    src = LocalHostSource(sys_root=str(tmp_path), nvml=NvmlSource(sys_root=str(tmp_path)), hostname="box")
    t = src.topology()
    assert [n.cpus for n in t.numa] == [(0, 1, 2, 3, 8), (4, 5, 6, 7)]
    assert [(p.name, t.numa[p.numa].node, p.rdma) for p in t.ports] == [("eth0", 1, False), ("mlx5_0:1", 0, True)]
    f = src.sample()
    assert f.numa_mem_free[0] == 1024 * 1024 and f.port_up.all()
    assert parse_cpulist("0-1,5") == (0, 1, 5)
