"""The gateway in-flight signal: the picker's own count of requests in flight per GPU, read
at every pick (not once per tick), so a burst of picks within one tick spreads over equal
GPUs instead of herding onto the model's best; its vectorised term equals its reference,
and the live counts stay bounded."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from placer_support import contract, instances

from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.framework import RequestInputs
from policyc.placer.signals import REGISTRY, SIGNALS
from policyc.placer.signals.gateway_in_flight import GatewayInFlight, InFlightCounts

SIG = REGISTRY["gateway_in_flight"]

_value = st.one_of(st.floats(min_value=0.0, max_value=30.0), st.just(float("nan")))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 50), _value, st.floats(min_value=0.0, max_value=5.0)), min_size=1, max_size=64))
def test_the_fast_term_equals_the_reference(rows: list[tuple[int, float, float]]) -> None:
    assert isinstance(SIG, GatewayInFlight) and SIG in SIGNALS
    counts, secs, rank = (np.array(c, dtype=np.float64) for c in zip(*rows))
    assert SIG.added(counts, secs, rank).tolist() == SIG.added_reference(counts.tolist(), secs.tolist(), rank.tolist())
    col = SIG.reference(RequestInputs(np.ones(len(rows)), np.zeros(len(rows)), rank, 1.0))
    assert col.fail is not None and not col.fail.any()  # it never refuses


def test_counts_follow_begin_and_end_and_are_bounded() -> None:
    now = [0.0]
    c = InFlightCounts(max_open=3, max_age_s=10.0, clock=lambda: now[0])
    c.begin("a", "h/gpu0")
    c.begin("a", "h/gpu0")  # the same decision twice counts once
    c.begin("b", "h/gpu0")
    assert c.count("h/gpu0") == 2 and c.seconds("h/gpu0") is None
    now[0] = 0.5
    assert c.end("a") == 0.5 and c.end("a") is None
    assert c.count("h/gpu0") == 1 and c.seconds("h/gpu0") == 0.5
    c.begin("c", "h/gpu1")
    c.begin("d", "h/gpu1")
    c.begin("e", "h/gpu1")  # past max_open: the oldest ("b") is forgotten
    assert c.count("h/gpu0") == 0 and c.count("h/gpu1") == 3 and c.forgotten == 1
    now[0] = 20.0  # past max_age_s: a lost end is forgotten, not counted for ever
    counts, secs = c.gather(["h/gpu0", "h/gpu1"])
    assert counts.tolist() == [0.0, 0.0] and secs.tolist() == [0.5, 0.5] and not c.busy()  # gpu1: every GPU's mean
    assert np.isnan(InFlightCounts().gather(["h/gpu0"])[1][0])  # nothing ended anywhere: the model's rank stands in


def _placer() -> tuple[Placer, list]:
    sim = SimulatedCluster(seed=7, hosts=4, gpus_per_host=4, hosts_per_rack=2)
    now = [0.0]
    r = Refresher(sim, clock=lambda: now[0])
    r.tick()
    return Placer(r, clock=lambda: now[0]), instances(sim)


def _burst(p: Placer, cands: list, n: int, count: bool) -> list[PlacementPlan]:
    out: list[PlacementPlan] = []
    for i in range(n):
        plan = p.place(cands, 0.2, contract())
        assert isinstance(plan, PlacementPlan), plan
        if count:  # what the gateway does when it forwards a pick (gateway/picker.py)
            p.in_flight.begin(f"d{i}", plan.gpu_key)
        out.append(plan)
    return out


def test_a_burst_within_one_tick_spreads_instead_of_herding() -> None:
    p, cands = _placer()
    cands = cands[:8]
    # without counts every pick of the tick sees the same ranks: the model's best takes the burst
    # until the share reserved this tick runs out there
    herd = [x.gpu_key for x in _burst(p, cands, 8, count=False)]
    assert max(Counter(herd).values()) >= 4, herd
    p, cands = _placer()
    cands = cands[:8]
    spread = _burst(p, cands, 8, count=True)
    by_gpu = Counter(x.gpu_key for x in spread)
    assert len(by_gpu) >= 4 and max(by_gpu.values()) <= 2, by_gpu
    # the second pick moved off the model's best (one in flight there) and its plan says why
    assert spread[1].gpu_key != spread[0].gpu_key == herd[0]
    assert any("in flight from this gateway on " + herd[0] in x for x in spread[1].reasons), spread[1].reasons
    # the requests end: the model's best is free again and takes the next pick
    for i in range(8):
        p.in_flight.end(f"d{i}")
    assert not p.in_flight.busy()
    again = p.place(cands, 0.2, contract())
    assert isinstance(again, PlacementPlan) and again.gpu_key == herd[0]


def test_a_measured_slow_gpu_weighs_more_per_request() -> None:
    """Two GPUs one request each in flight: the one whose requests have measured slower
    (an L4 against an H100) ranks behind, its class's speed shown by the gateway's clock."""
    p, cands = _placer()
    cands = cands[:8]
    first = _burst(p, cands, 1, count=False)[0].gpu_key
    now = [0.0]
    p._picker.in_flight = c = InFlightCounts(clock=lambda: now[0])
    c.begin("slow", first)  # the model's best has measured 5 s a request
    now[0] = 5.0
    c.end("slow")
    c.begin("busy", first)
    plan = p.place(cands, 0.2, contract())
    assert isinstance(plan, PlacementPlan) and plan.gpu_key != first
