"""The measured-gauge signals (`signals/running_requests.py`, `signals/kv_cache.py`, both on
`placer/gauge_signal.py`): each one's fast column equals its reference in every setting
(bounded or not, falling back or excluding stale readings, over the hostile world of
test_signals.py); through the placer, a GPU whose KV cache is near full is refused with its
use in words, a full batch adds its decode to the prediction and moves the placement, the
plan names the measured value it used and says when one was stale; the whole evaluation
stays equal between the runners with these readings."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from placer_support import contract, instances, redis
from test_lookup_tables import _assert_same
from test_signals import CATALOG, _same, _world

from policyc.placer import Constraint, NoPlacement, PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.contract_table import contract_table
from policyc.placer.evaluate import evaluate
from policyc.placer.framework import EVERY, OnStale, TickInputs
from policyc.placer.gauge_signal import GaugeSignal
from policyc.placer.lookup import lookup
from policyc.placer.measured import WithReadings
from policyc.placer.paths import ingress_rows
from policyc.placer.readings import Reading
from policyc.placer.signals import REGISTRY
from policyc.placer.signals.kv_cache import KvCache
from policyc.placer.signals.measured_ttft import MeasuredTtft
from policyc.placer.signals.running_requests import RunningRequests

VARIANTS: dict[str, Callable[[], GaugeSignal]] = {
    "running, registered": lambda: RunningRequests(),
    "running, bounded, excluding stale": lambda: RunningRequests(max_running=120, on_stale=OnStale.EXCLUDE),
    "running, heavy decode, strict age": lambda: RunningRequests(seconds_per_running=2e-3, max_age_s=0.1),
    "kv, registered": lambda: KvCache(),
    "kv, tight, excluding stale": lambda: KvCache(max_usage=0.5, on_stale=OnStale.EXCLUDE),
    "kv, no bound, slow": lambda: KvCache(max_usage=1.0, seconds_at_half=0.02),
    "ttft, registered": lambda: MeasuredTtft(),
    "ttft, bounded, excluding stale": lambda: MeasuredTtft(max_ttft_s=0.3, on_stale=OnStale.EXCLUDE),
}


@pytest.fixture(scope="module")
def world():  # type: ignore[no-untyped-def]
    return _world()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("conservative", [False, True])
@pytest.mark.parametrize("k", [1, 9, 64, 192])
def test_fast_column_equals_reference(world, variant: str, conservative: bool, k: int) -> None:  # type: ignore[no-untyped-def]
    s = VARIANTS[variant]()
    snap = world
    th = snap.thresholds.conservative() if conservative else snap.thresholds
    rows = ingress_rows(snap, None)
    rng = np.random.default_rng(k)
    gpus = np.sort(rng.choice(len(snap.topology.gpus), k, replace=False)).astype(np.int64)
    fast = s.column(TickInputs(snap, th, EVERY, rows)).at(gpus)
    ref = s.reference(TickInputs(snap, th, gpus, rows[gpus]))
    _same(fast, ref, variant)
    if k == 192:  # every GPU: the world exercises refusals, seconds and stale readings
        assert ref.latency is not None and ref.latency.any() and ref.fail is not None
        assert (ref.stale is not None and ref.stale.any()) or (s.on_stale is OnStale.EXCLUDE and ref.fail.any())


def _placer(readings: dict[str, Reading]) -> tuple[Placer, list]:
    sim = SimulatedCluster(seed=7, hosts=4, gpus_per_host=4, hosts_per_rack=2)
    now = [0.0]
    r = Refresher(WithReadings(sim, lambda: readings), clock=lambda: now[0])
    r.tick()
    return Placer(r, clock=lambda: now[0]), instances(sim)


def _place(p: Placer, cands: list, key: str = "k") -> PlacementPlan | NoPlacement:
    return p.place(cands[:4], 0.2, contract(), affinity_key=key)


def test_a_nearly_full_kv_cache_is_refused_in_words_and_the_plan_names_the_use() -> None:
    quiet, cands = _placer({})
    first = _place(quiet, cands)
    assert isinstance(first, PlacementPlan)
    keys = [f"{c.deployment.host}/{c.deployment.gpu}" for c in cands[:4]]
    p, cands = _placer({first.gpu_key: Reading({"kv_cache_usage": 0.97}, 0.02),
                        **{k: Reading({"kv_cache_usage": 0.4}, 0.03) for k in keys if k != first.gpu_key}})
    plan = _place(p, cands)
    assert isinstance(plan, PlacementPlan) and plan.gpu_key != first.gpu_key
    rej = [x for x in plan.rejected if x.gpu == first.gpu_key]
    assert rej and rej[0].constraint is Constraint.KV_CACHE and rej[0].detail == "KV-cache use 97% > 95%"
    note = [x for x in plan.reasons if x.startswith(f"KV-cache use of {plan.gpu_key}: 40%, measured 30 ms ago")]
    assert note, plan.reasons


def test_a_full_batch_adds_its_decode_and_moves_the_placement() -> None:
    quiet, cands = _placer({})
    first = _place(quiet, cands)
    assert isinstance(first, PlacementPlan)
    busy = {first.gpu_key: Reading({"running": 200.0}, 0.01)}
    p, cands = _placer(busy)
    moved = _place(p, cands)
    assert isinstance(moved, PlacementPlan) and moved.gpu_key != first.gpu_key
    only = [c for c in cands if f"{c.deployment.host}/{c.deployment.gpu}" == first.gpu_key]
    there = p.place(only, 0.2, contract(), affinity_key="only")
    assert isinstance(there, PlacementPlan)
    assert there.latency.queueing == pytest.approx(first.latency.queueing + 200 * REGISTRY["running_requests"].seconds_per_running)
    assert any(x.startswith(f"running requests of {first.gpu_key}: 200, measured 10 ms ago") for x in there.reasons)


@pytest.mark.parametrize("name,values", [("running_requests", {"running": 50.0}), ("kv_cache", {"kv_cache_usage": 0.9})])
def test_a_stale_gauge_falls_back_and_the_plan_says_so(name: str, values: dict[str, float]) -> None:
    quiet, cands = _placer({})
    first = _place(quiet, cands)
    assert isinstance(first, PlacementPlan)
    p, cands = _placer({f"{c.deployment.host}/{c.deployment.gpu}": Reading(values, 1.5) for c in cands[:4]})
    plan = _place(p, cands)
    assert isinstance(plan, PlacementPlan)
    assert (plan.gpu_key, plan.latency) == (first.gpu_key, first.latency)  # the old number is not used
    what = REGISTRY[name].what  # type: ignore[attr-defined]
    notes = [x for x in plan.reasons if x.startswith(f"{what} of {plan.gpu_key} is stale")]
    assert notes and "1.50 s old" in notes[0], plan.reasons


def test_a_gauge_declared_to_exclude_refuses_stale_readings_by_name(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(REGISTRY["kv_cache"], "on_stale", OnStale.EXCLUDE)
    _, cands = _placer({})
    keys = [f"{c.deployment.host}/{c.deployment.gpu}" for c in cands[:4]]
    p, cands = _placer({k: Reading({"kv_cache_usage": 0.2}, 0.9) for k in keys})
    out = _place(p, cands)
    assert isinstance(out, NoPlacement) and out.binding is Constraint.KV_CACHE, out
    assert all("0.90 s old" in x.detail and "excluded as stale" in x.detail for x in out.rejected)


@pytest.mark.parametrize("k", [8, 40])  # the scalar path and numpy's
def test_the_tables_give_the_reference_figures_with_gauges(monkeypatch, k: int) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(REGISTRY["running_requests"], "bound", 150.0)
    snap = _world()
    t = snap.topology
    c = contract(services=(redis(proxy="dedicated"),))
    table = contract_table(c, t, CATALOG)
    rng = np.random.default_rng(k)
    saw = set()
    for budget in (0.2, 0.04):
        for _ in range(6):
            gpus = rng.choice(len(t.gpus), k, replace=False).astype(np.int64)
            reserved = rng.uniform(0, 0.3, k) * (rng.random(k) < 0.3)
            ref = evaluate(snap, snap.thresholds, gpus, table.bounds, CATALOG, c, budget, ingress_rows(snap, None)[gpus],
                           reserved)
            got = lookup(snap, snap.thresholds, gpus, None, table, reserved, budget)
            _assert_same(got, ref, "gauges")
            saw |= {ref.failed(i) for i in range(k)}
    assert {Constraint.KV_CACHE, Constraint.RUNNING_REQUESTS} & saw


def test_a_slower_servers_measured_first_tokens_move_the_placement() -> None:
    """Two servers, one answering first tokens in 20 ms on average, one in 400 ms (a slower
    class): the fast one is chosen, and the plan names its measured mean; a server that has
    answered nothing yet is left to the model."""
    quiet, cands = _placer({})
    first = _place(quiet, cands)
    assert isinstance(first, PlacementPlan)
    keys = [f"{c.deployment.host}/{c.deployment.gpu}" for c in cands[:4]]
    other = next(k for k in keys if k != first.gpu_key)
    p, cands = _placer({first.gpu_key: Reading({"ttft_sum_s": 40.0, "ttft_count": 100.0}, 0.02),
                        other: Reading({"ttft_sum_s": 2.0, "ttft_count": 100.0}, 0.02),
                        **{k: Reading({"ttft_sum_s": 0.0, "ttft_count": 0.0}, 0.02) for k in keys if k not in (first.gpu_key, other)}})
    plan = p.place([c for c in cands if f"{c.deployment.host}/{c.deployment.gpu}" in (first.gpu_key, other)], 0.2, contract(),
                   affinity_key="ttft")
    assert isinstance(plan, PlacementPlan) and plan.gpu_key == other
    assert any(x.startswith(f"measured mean TTFT of {other}: 20.0 ms, measured 20 ms ago") for x in plan.reasons), plan.reasons


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="KV-cache signal: max_usage 1.5"):
        KvCache(max_usage=1.5)
    with pytest.raises(ValueError, match="running requests signal: seconds_per_running -1"):
        RunningRequests(seconds_per_running=-1)
    with pytest.raises(ValueError, match="max_age_s 0"):
        RunningRequests(max_age_s=0)
