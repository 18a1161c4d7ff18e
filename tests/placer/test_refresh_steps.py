"""A refresh's long steps are split so that none holds a serving loop for long: the fabric
search runs a chunk of sources per step, a path table is built in three steps. Split or
not, what they build is the same, bit for bit."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from policyc.placer import Refresher, SimulatedCluster
from policyc.placer import paths, snapshot
from policyc.placer.snapshot import build_snapshot, build_steps


def _world() -> tuple[SimulatedCluster, Refresher]:
    sim = SimulatedCluster(11, 48, 4, hosts_per_rack=6)
    t = sim.topology()
    for p in (2, 9, 17):
        sim.watermark(t.port_key(p), 0.95)  # congested ports: some hops are blocked
    sim.link_down(t.port_key(3))
    r = Refresher(sim)
    r.tick()
    return sim, r


def _build(r: Refresher, frame, prev) -> snapshot.Snapshot:  # noqa: ANN001
    t = r.source.topology()
    return build_snapshot(prev.version + 1, t, frame, prev, None, r.thresholds, r.interval, 1.0)


def _steps(r: Refresher, frame, prev) -> int:  # noqa: ANN001
    g = build_steps(prev.version + 1, r.source.topology(), frame, prev, None, r.thresholds, r.interval, 1.0)
    return sum(1 for _ in g)


def test_the_fabric_search_in_chunks_is_the_search_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sim, r = _world()
    prev, frame = r.current(), sim.sample()
    t = sim.topology()
    sources = sorted(set(t.ingress.values()) | {e.node for e in t.endpoints})
    assert len(sources) >= 12
    monkeypatch.setattr(snapshot, "SEARCH_CHUNK", len(sources))
    whole, whole_steps = _build(r, frame, prev), _steps(r, frame, prev)
    monkeypatch.setattr(snapshot, "SEARCH_CHUNK", 1)
    monkeypatch.setattr(snapshot, "SEARCH_STEPS_MOST", len(sources))
    one_by_one, many_steps = _build(r, frame, prev), _steps(r, frame, prev)
    assert many_steps == whole_steps + len(sources) - 1  # one step per source
    for name in ("fabric_dist", "fabric_var", "scores", "gpu_health", "port_delay"):
        a, b = getattr(whole, name), getattr(one_by_one, name)
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), name
    assert whole.fabric_rows == one_by_one.fabric_rows
    assert not one_by_one.fabric_dist.flags.writeable
    # the chunks are bounded in number (the fabric module keeps 8 search graphs): 6 at most
    monkeypatch.setattr(snapshot, "SEARCH_STEPS_MOST", 6)
    assert _steps(r, frame, prev) == whole_steps + 6 - 1


def test_a_path_table_built_in_steps_is_the_table_built_at_once() -> None:
    sim, r = _world()
    snap = r.tick()
    key = (snap.thresholds, sim.topology().ingress[next(iter(sim.topology().ingress))])
    at_once = paths._build(snap, *key)
    g = paths._build_steps(snap, *key)
    steps = 0
    while True:
        try:
            next(g)
            steps += 1
        except StopIteration as done:
            stepped = done.value
            break
    assert steps == 2
    for name in ("code", "network", "sigma2", "port", "raw_network"):
        assert np.array_equal(getattr(at_once, name), getattr(stepped, name), equal_nan=True), name
    assert stepped.thresholds == at_once.thresholds and stepped.ingress == at_once.ingress


def test_warming_keeps_a_table_a_request_built_while_it_stepped() -> None:
    """A request reading a table the refresher is half-way through building builds its
    own; the refresher then keeps the request's (the one requests already read)."""
    sim, r = _world()
    first = r.tick()
    paths.path_table(first, first.thresholds, None)
    nxt = r.tick()
    nxt.tables.clear()  # as if just built, before its tables are warmed
    warm = paths.warm_steps(nxt, first)
    next(warm)  # half-way through the default table
    mine = paths.path_table(nxt, nxt.thresholds, None)
    for _ in warm:
        pass
    assert nxt.tables[(nxt.thresholds, None)] is mine


def test_each_step_is_recorded_with_what_it_did() -> None:
    """`step_records()`: span, CPU and kind of each step, read together; the kinds name the
    refresher's own steps, the split ones and each listener's."""
    sim, r = _world()

    class Settler:
        def __call__(self, new, previous) -> None:  # noqa: ANN001
            return None

    def pusher(new, previous):  # noqa: ANN001, ANN202
        yield 1
        yield 2

    r.on_refresh(pusher)
    r.on_refresh(Settler())
    before = len(r.step_records())
    r.tick()
    recs = r.step_records()[before:]
    kinds = [k.kind for k in recs]
    assert kinds[0] == "sample" and kinds[-1] == "end"
    assert kinds[1:4] == ["snapshot: GPU and port state", "snapshot: hop costs", "snapshot: fabric search"]
    assert "snapshot: scores" in kinds and "path table" in kinds
    listener = f"listener {pusher.__qualname__}"
    assert kinds[-6:] == ["publish", listener, listener, listener, "listener Settler", "end"]
    assert [(x.start, x.end) for x in recs] == list(r.spans()[before:])
    assert [x.cpu for x in recs] == list(r.step_cpu()[before:])
    assert all(x.start <= x.end and x.cpu >= 0 for x in recs)
    gc.collect()  # the history the refresher keeps is nothing the collector scans again
    assert not any(gc.is_tracked(x) for x in r._steps)
