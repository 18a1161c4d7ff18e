"""Score pushes from the placer to the matcher are bounded per tick, largest move first, and
converge: a drift is measured against what was last pushed, not against the last tick."""

from __future__ import annotations

import time

import numpy as np
import pytest

from server_rig import SMALL, start

from policyc.compiler.bundle import Bundle
from policyc.placer import Refresher, SimulatedCluster
from policyc.server.app import DecisionServer
from policyc.server.config import ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.score_push import ScorePusher


class Sink:
    """A stand-in for the engine: `per_gpu` (model, GPU) groups on every GPU."""

    def __init__(self, per_gpu: int) -> None:
        self.per_gpu = per_gpu
        self.scores: dict[tuple[str, str], float] = {}
        self.calls = 0

    def groups_on(self, host: str, gpu: str) -> int:
        return self.per_gpu

    def push_scores(self, changes: list[tuple[str, str, float]]) -> int:
        self.calls += 1
        for host, gpu, s in changes:
            self.scores[(host, gpu)] = s
        return len(changes) * self.per_gpu


def test_budget_bounds_each_tick_and_the_biggest_move_goes_first() -> None:
    sim = SimulatedCluster(2, 16, 4, hosts_per_rack=4)
    r = Refresher(sim)
    sink = Sink(per_gpu=10)
    pusher = ScorePusher(sink, budget=50)
    pusher.baseline(r.tick())
    t = sim.topology()
    victim = t.gpu_key(5)
    sim.sm_collapse(victim, 0.1)
    r.tick()
    snap = r.tick()  # collapse detected: the victim's score falls to 0
    assert snap.scores[5] == 0.0
    updates = sum(pusher.steps(snap))
    assert updates <= 50 and sink.scores[tuple(victim.split("/"))] == 0.0  # pushed first
    assert pusher.deferred > 0  # the noise moved more GPUs than the budget allows


def test_pushes_converge_to_the_snapshot_within_min_delta() -> None:
    sim = SimulatedCluster(2, 16, 4, hosts_per_rack=4, noise=0.0)
    r = Refresher(sim)
    sink = Sink(per_gpu=3)
    pusher = ScorePusher(sink, budget=9)
    snap = r.tick()
    for _ in range(40):  # nothing baselined: everything is due, three GPUs per tick
        sum(pusher.steps(snap))
    t = snap.topology
    pushed = np.array([sink.scores[(t.hosts[g.host].name, g.gpu_id)] for g in t.gpus])
    np.testing.assert_array_equal(pushed, snap.scores)
    assert sum(pusher.steps(snap)) == 0 and pusher.deferred == 0


def test_gpus_without_instances_cost_nothing_and_a_bad_budget_is_refused() -> None:
    sim = SimulatedCluster(2, 4, 2, hosts_per_rack=2)
    r = Refresher(sim)
    sink = Sink(per_gpu=0)
    pusher = ScorePusher(sink, budget=1)
    assert sum(pusher.steps(r.tick())) == 0 and sink.calls == 0 and pusher.deferred == 0
    with pytest.raises(ValueError, match="at least 1"):
        ScorePusher(sink, budget=0)


def test_the_server_registers_fleets_with_current_scores(served) -> None:
    eng, snap = served.server.engine, served.server.refresher.current()
    inst, _, score = eng.state.registry.entries()[0]
    assert score == snap.gpu_score(inst.deployment.host, inst.deployment.gpu)


def test_pushes_come_as_steps_of_bounded_chunks_and_a_gpu_is_pushed_once_its_batch_lands() -> None:
    sim = SimulatedCluster(3, 16, 4, hosts_per_rack=4)
    r = Refresher(sim)
    sink = Sink(per_gpu=10)
    pusher = ScorePusher(sink, budget=200, chunk=25)
    pusher.baseline(r.tick())
    for _ in range(4):
        snap = r.tick()
        steps = pusher.steps(snap)
        moves = [next(steps, None)]
        if moves[0] is not None:
            break
    assert moves[0] == 20 and sink.calls == 1  # one batch per step: two GPUs of 10 moves (25 at most)
    moves += list(steps)
    assert all(m == 20 for m in moves[:-1]) and 0 < moves[-1] <= 20 and sink.calls == len(moves)
    assert sum(moves) <= 200 and len(sink.scores) * sink.per_gpu == sum(moves)
    for (host, gpu), s in sink.scores.items():
        assert s == snap.scores[snap.topology.gpu_index[(host, gpu)]]

    # stopped half-way (the refresher dropped the refresh): what was not pushed stays due
    victim = snap.topology.gpu_key(7)
    sim.sm_collapse(victim, 0.1)
    for _ in range(3):
        snap = r.tick()
    assert snap.scores[7] == 0.0
    before = dict(sink.scores)
    steps = pusher.steps(snap)
    next(steps)  # the victim's batch: the biggest move goes first
    steps.close()
    pushed = {k for k, v in sink.scores.items() if before.get(k) != v}
    assert tuple(victim.split("/")) in pushed
    assert sum(pusher.steps(snap)) > 0  # the rest of the tick's share is still due
    for (host, gpu), s in sink.scores.items():
        if before.get((host, gpu)) != s:
            assert s == snap.scores[snap.topology.gpu_index[(host, gpu)]]
    with pytest.raises(ValueError, match="chunk"):
        ScorePusher(sink, chunk=0)


def test_the_engine_pushes_a_chunk_as_one_batch_of_group_moves(bundle: Bundle) -> None:
    """A chunk is one `Registry.set_gpu_scores` call; it moves each (model, GPU) group on
    the GPUs named once, whatever the copies on it, clamps scores into [0, 1], and skips
    a GPU whose instances have all gone meanwhile."""
    server = DecisionServer(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    assert server.cluster is not None
    eng = server.engine
    eng.register_many(admissible_fleet(bundle, server.cluster.gpu_slots(), replicas=3))
    reg = eng.state.registry
    by_gpu: dict[tuple[str, str], list[str]] = {}
    for inst, _, _ in reg.entries():
        by_gpu.setdefault((inst.deployment.host, inst.deployment.gpu), []).append(inst.id)
    (g1, on1), (g2, on2) = [(g, ids) for g, ids in sorted(by_gpu.items()) if eng.groups_on(*g) >= 2][:2]
    batches: list[list[tuple[str, str, float]]] = []
    real = reg.set_gpu_scores

    def spy(changes: list[tuple[str, str, float]]) -> int:
        batches.append(list(changes))
        return real(batches[-1])

    reg.set_gpu_scores = spy  # type: ignore[method-assign]
    groups = eng.groups_on(*g1) + eng.groups_on(*g2)
    assert len(on1) + len(on2) == 3 * groups  # three copies of each model on each GPU
    assert eng.push_scores([(*g1, 1.7), (*g2, -0.2)]) == groups
    assert batches == [[(*g1, 1.0), (*g2, 0.0)]]
    assert [reg.score(i) for i in on1 + on2] == [1.0] * len(on1) + [0.0] * len(on2)  # clamped to [0, 1]
    for iid in on1:  # deregistered behind the engine's back: the rest of the chunk still lands
        reg.remove(iid)
    assert eng.groups_on(*g1) == 0
    assert eng.push_scores([(*g1, 0.25), (*g2, 0.5)]) == eng.groups_on(*g2)
    assert [reg.score(i) for i in on2] == [0.5] * len(on2)


@pytest.mark.parametrize("on_loop", [True, False])
def test_the_server_refreshes_where_configured_and_pushes_scores_as_it_goes(bundle: Bundle, on_loop: bool) -> None:
    """`refresh_on_loop`: the refresher's steps (score pushes among them) run on the serving
    loop, no refresher thread; False: on the refresher's own thread. Either way new
    snapshots keep coming and a collapsed GPU's groups fall to 0 in the matcher's ranking."""
    th = start(bundle, ServeConfig(cluster=SMALL, refresh_interval=0.05, refresh_on_loop=on_loop))
    try:
        server = th.server
        assert (server.refresher._thread is None) is on_loop
        inst, _, _ = server.engine.state.registry.entries()[0]
        d = inst.deployment
        assert server.cluster is not None
        server.cluster.sm_collapse(f"{d.host}/{d.gpu}", 0.05)
        deadline = time.monotonic() + 10
        while server.engine.state.registry.score(inst.id) > 0.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.engine.state.registry.score(inst.id) == 0.0 and not server.refresher.errors
    finally:
        th.stop()
