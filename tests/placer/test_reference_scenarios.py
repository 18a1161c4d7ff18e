"""The issue's reference scenarios, on the simulator."""

from __future__ import annotations

from placer_support import contract, instances, redis

from policyc.compiler.bundle import Session
from policyc.placer import Constraint, NoPlacement, PlacementPlan, Placer, Refresher, SimulatedCluster, Thresholds

GPU_A, GPU_B = "host-0000/gpu0", "host-0004/gpu0"  # both H100 for seed 3, one port each


def _watermark_world(thresholds: Thresholds) -> tuple[SimulatedCluster, Placer, Refresher]:
    sim = SimulatedCluster(3, 8, 1, numa_per_host=1, hosts_per_rack=8, noise=0.0)
    sim.watermark("host-0000/mlx5_0", 0.89)  # GPU_A's only RDMA port
    sim.occupy(GPU_B, 0.3, ticks=100)  # GPU_B busier: it predicts slower than GPU_A
    r = Refresher(sim, thresholds=thresholds)
    r.tick()
    return sim, Placer(r), r


def test_watermark_89_percent_is_avoided_although_it_predicts_faster() -> None:
    sim, placer, _ = _watermark_world(Thresholds())
    plan = placer.place(instances(sim, keys=[GPU_A, GPU_B]), 0.2, contract(flops=2e13))
    assert isinstance(plan, PlacementPlan)
    assert plan.gpu_key == GPU_B
    (rej,) = plan.rejected
    assert rej.gpu == GPU_A and rej.constraint is Constraint.PORT
    assert "watermark 89% > 80%" in rej.detail
    would = float(rej.detail.split("would predict ")[1].split(" ms")[0])
    assert would < plan.latency.total * 1e3  # A predicts faster, B is chosen anyway


def test_stability_alone_prefers_the_stable_gpu_when_the_watermark_is_allowed() -> None:
    sim, placer, _ = _watermark_world(Thresholds(max_port_watermark=0.95))
    plan = placer.place(instances(sim, keys=[GPU_A, GPU_B]), 0.2, contract(flops=2e13))
    assert isinstance(plan, PlacementPlan) and plan.gpu_key == GPU_B
    # both feasible: the reasons show the runner-up predicted lower but ranked worse
    text = plan.reasons[0]
    runner = float(text.split(f"runner-up {GPU_A} predicted ")[1].split(" ms")[0])
    assert runner < plan.latency.total * 1e3
    assert "rdma_watermark" not in " ".join(plan.probes) or plan.rdma_port != "host-0000/mlx5_0"


def test_collapsed_gpu_is_avoided_on_the_next_tick(sim: SimulatedCluster) -> None:
    r = Refresher(sim)
    placer = Placer(r)
    r.tick()
    cands = instances(sim)
    first = placer.place(cands, 0.2, contract())
    assert isinstance(first, PlacementPlan)
    sim.sm_collapse(first.gpu_key, 0.15)
    still = placer.place(cands, 0.2, contract())  # same snapshot: not yet visible
    assert isinstance(still, PlacementPlan)
    r.tick()
    after = placer.place(cands, 0.2, contract())
    assert isinstance(after, PlacementPlan) and after.gpu_key != first.gpu_key
    rej = next(x for x in after.rejected if x.gpu == first.gpu_key)
    assert rej.constraint is Constraint.HEALTH and "collapsed" in rej.detail
    host, gpu = first.gpu_key.split("/")
    assert r.current().gpu_score(host, gpu) == 0.0
    changed = {(h, g) for h, g, _ in r.current().score_changes(r.previous())}
    assert (host, gpu) in changed


def test_stale_snapshot_is_flagged_and_placement_turns_conservative(sim: SimulatedCluster) -> None:
    now = [100.0]
    clock = lambda: now[0]  # noqa: E731
    r = Refresher(sim, interval=0.2, clock=clock)
    placer = Placer(r, clock=clock)
    cands = instances(sim)
    r.tick()
    fresh = placer.place(cands, 0.2, contract())
    assert isinstance(fresh, PlacementPlan) and not fresh.stale
    # a port at 70 %: fine normally, too close to the limit when the picture is old
    sim.watermark(f"{fresh.host}/mlx5_0", 0.7)
    sim.watermark(f"{fresh.host}/mlx5_1", 0.7)
    r.tick()
    now[0] += 0.41
    assert r.current().is_stale(clock()) and r.is_stale()
    stale = placer.place(cands, 0.2, contract())
    assert isinstance(stale, PlacementPlan) and stale.stale
    assert "telemetry_staleness" in stale.probes
    assert any("stale" in x for x in stale.reasons)
    assert stale.host != fresh.host
    assert any(x.constraint is Constraint.PORT and x.gpu.startswith(fresh.host) for x in stale.rejected)


def test_session_stays_until_infeasible_then_moves_nearby_and_says_so() -> None:
    sim = SimulatedCluster(seed=11, hosts=4, gpus_per_host=4, hosts_per_rack=4)
    r = Refresher(sim)
    placer = Placer(r)
    r.tick()
    c = contract(session=Session(state="nvme", colocate="none"))
    cands = instances(sim)
    first = placer.place(cands, 0.2, c, session="chat-1")
    assert isinstance(first, PlacementPlan) and first.session_move is None
    # the GPU gets busier (another GPU is now better), but it stays feasible: no move
    sim.occupy(first.gpu_key, 0.3, ticks=3)
    for _ in range(3):
        r.tick()
        again = placer.place(cands, 0.2, c, session="chat-1")
        assert isinstance(again, PlacementPlan)
        assert again.gpu_key == first.gpu_key and again.session_move is None
        assert any("stays" in x for x in again.reasons)
    sim.sm_collapse(first.gpu_key)
    r.tick()
    moved = placer.place(cands, 0.2, c, session="chat-1")
    assert isinstance(moved, PlacementPlan) and moved.gpu_key != first.gpu_key
    assert moved.session_move is not None
    assert moved.session_move.from_gpu == first.gpu_key and moved.session_move.to_gpu == moved.gpu_key
    assert "health" in moved.session_move.reason
    assert moved.host == first.host and moved.numa_node == first.numa_node  # same NUMA node: state stays local
    assert "NUMA node" in moved.session_move.reason
    r.tick()
    settled = placer.place(cands, 0.2, c, session="chat-1")
    assert isinstance(settled, PlacementPlan) and settled.gpu_key == moved.gpu_key and settled.session_move is None


def test_hidden_redis_dependency_at_800ms_is_seen_and_avoided() -> None:
    sim = SimulatedCluster(seed=5, hosts=2, gpus_per_host=2, hosts_per_rack=2)  # one region: us-west
    r = Refresher(sim)
    placer = Placer(r)
    r.tick()
    cands = instances(sim)
    ok = placer.place(cands, 0.2, contract(services=(redis(5e-3),)))
    assert isinstance(ok, PlacementPlan)
    assert ok.dependencies[0].endpoint == "redis-us-west" and "dependency_p99:redis-us-west" in ok.probes
    sim.service_p99("redis-us-west", 0.8)
    r.tick()
    refused = placer.place(cands, 0.2, contract(services=(redis(5e-3),)))
    assert isinstance(refused, NoPlacement) and refused.binding is Constraint.DEPENDENCY
    assert "redis-us-west" in refused.message and "800" in refused.message
    proxied = placer.place(cands, 0.2, contract(services=(redis(5e-3, proxy="dedicated"),)))
    assert isinstance(proxied, PlacementPlan)
    (b,) = proxied.dependencies
    assert b.endpoint == "cacheproxy-redis-us-west" and b.role == "dedicated" and b.predicted <= 5e-3
    assert proxied.latency.dependencies == b.predicted
