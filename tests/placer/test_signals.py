"""The placement signals (`placer/signals/`): one file each, registered by name, run by two
runners. Each signal's fast column (what the per-tick tables run, for every GPU at once)
must equal its reference (what `evaluate.evaluate` runs over a request's candidates), and
the request-stage signals' unrolled scalar arithmetic (`lookup.scalar_rows`) must equal
their vectorised filters."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from placer_support import REF, contract, redis

from policyc.compiler.bundle import GpuShare, ServiceDependency, Session
from policyc.compiler.meaning import MIN_SHARE as LEAST_SHARE, compute_seconds
from policyc.placer import Refresher, SimulatedCluster, signals as signals_pkg
from policyc.placer.catalog import DEFAULT_CATALOG, catalog_by_name
from policyc.placer.contract_table import contract_table
from policyc.placer.framework import (
    EVERY, Column, ContractInputs, OnStale, RequestInputs, Signal, Stage, TickContractInputs, TickInputs,
)
from policyc.placer.latency import gpu_queue
from policyc.placer.lookup import scalar_rows
from policyc.placer.paths import NO_FAILURE, ingress_rows, path_table
from policyc.placer.plan import Constraint
from policyc.placer.readings import Reading
from policyc.placer.signals import BY_CONSTRAINT, CODE, ORDER, REGISTRY, SIGNALS, of_stage
from policyc.placer.signals.queue_depth import QueueDepth
from policyc.placer.tick_table import Layout

CATALOG = catalog_by_name(DEFAULT_CATALOG)
CONTRACTS = {
    "plain": contract(),
    "redis proxies": contract(services=(redis(proxy="dedicated"), ServiceDependency(
        name="db", kind="postgres", p99=20e-3, proxy="none", origin=REF), redis(p99=3e-3, proxy="shared"))),
    "no such service": contract(services=(ServiceDependency(name="m", kind="memcached", p99=1e-3, origin=REF),)),
    "session nvme and store": contract(session=Session(state="nvme", colocate="same_numa"), services=(
        ServiceDependency(name="st", kind="nvme", p99=4e-3, origin=REF),)),
    "solver shares": contract(gpu_shares=(
        GpuShare(gpu="H100", feasible=True, min_share=0.3, binding="compute", detail="d"),
        GpuShare(gpu="L4", feasible=False, binding="bandwidth", detail="too slow"))),
}


def _world():  # type: ignore[no-untyped-def]
    """A hostile small cluster (congested and failed ports, collapsed GPUs, a slow redis)
    whose frame carries measured readings: fresh, stale, unusable, and for GPUs not in
    the topology."""
    sim = SimulatedCluster(11, 48, 4, hosts_per_rack=6)
    t = sim.topology()
    rng = np.random.default_rng(1)
    for p in rng.choice(len(t.ports), 12, replace=False):
        sim.watermark(t.port_key(int(p)), float(rng.uniform(0.5, 0.99)))
    sim.link_down(t.port_key(3))
    for g in rng.choice(len(t.gpus), 8, replace=False):
        sim.sm_collapse(t.gpu_key(int(g)))
    sim.service_p99("redis-us-west", 0.8)
    r = Refresher(sim)
    r.tick()
    r.tick()
    snap = r.current()
    measured = {}
    for g in rng.choice(len(t.gpus), len(t.gpus) // 2, replace=False).tolist():
        depth = float(rng.integers(0, 40)) if g % 7 else float("nan")
        kv = float(rng.uniform(0, 1.05)) if g % 5 else float("nan")  # over 1 or NaN: unusable, stale
        measured[t.gpu_key(g)] = Reading({"queue_depth": depth, "kv_cache_usage": kv, "running": float(rng.integers(0, 300)),
                                          "ttft_sum_s": float(rng.uniform(0, 50)), "ttft_count": float(rng.integers(0, 200))},
                                         float(rng.uniform(0, 0.6)))
    measured["no-such-host/gpu0"] = Reading({"queue_depth": 3.0}, 0.0)
    for p in rng.choice(len(t.ports), len(t.ports) // 2, replace=False).tolist():  # host agents' measured port backlog
        measured[t.port_key(p)] = Reading({"port_backlog_fraction": float(rng.uniform(0, 1)), "port_backlog_bytes": 5e4,
                                           "port_up": float(p % 11 != 0), "stale_after_s": 1.0}, float(rng.uniform(0, 1.5)))
    pcie = snap.frame.gpu_pcie_util.copy()
    pcie[::5] = 0.95  # over the limit (the simulator's PCIe stays low)
    wm = snap.frame.port_watermark.copy()
    wm[: len(wm) // 4] = 0.97  # both ports of the first hosts over the watermark
    frame = dataclasses.replace(snap.frame, measured=measured, gpu_pcie_util=pcie, port_watermark=wm)
    return dataclasses.replace(snap, frame=frame, tables={}, port_paths={})  # new telemetry: nothing derived kept


def _same(fast: Column, ref: Column, what: str) -> None:
    for f in ("fail", "latency", "stale"):
        a, b = getattr(fast, f), getattr(ref, f)
        assert (a is None) == (b is None), f"{what}: {f} present in one runner only"
        if a is not None:
            assert a.dtype == b.dtype, f"{what}: {f} dtype"
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: {f}")
    assert len(fast.extra) == len(ref.extra), what
    for (s1, e1, b1, l1), (s2, e2, b2, l2) in zip(fast.extra, ref.extra, strict=True):
        assert s1 is s2 and [e.name for e in e1] == [e.name for e in e2], what
        np.testing.assert_array_equal(b1, b2, err_msg=f"{what}: best endpoint")
        np.testing.assert_array_equal(l1, l2, err_msg=f"{what}: binding latency")


TABLED = [s.name for s in SIGNALS if s.stage is not Stage.REQUEST]
CONFIGURED = {  # registered signals with other settings than their registration's
    "queue_depth (bounded, excluding stale)": lambda: QueueDepth(max_depth=20, on_stale=OnStale.EXCLUDE),
}


@pytest.fixture(scope="module")
def world():  # type: ignore[no-untyped-def]
    return _world()


@pytest.mark.parametrize("name", TABLED + sorted(CONFIGURED))
@pytest.mark.parametrize("ingress", [None, "ingress/us-east"])
@pytest.mark.parametrize("stale", [False, True])
def test_each_signals_fast_column_equals_its_reference(world, name: str, ingress: str | None, stale: bool) -> None:  # type: ignore[no-untyped-def]
    s = REGISTRY[name] if name in REGISTRY else CONFIGURED[name]()
    snap = world
    t = snap.topology
    th = snap.thresholds.conservative() if stale else snap.thresholds
    node = None if ingress is None else t.fabric_index[ingress]
    rows = ingress_rows(snap, node)
    rng = np.random.default_rng(len(name))
    exercised = False
    for cname, c in CONTRACTS.items():
        table = contract_table(c, t, CATALOG)
        for k in (1, 9, 64):
            gpus = np.sort(rng.choice(len(t.gpus), k, replace=False)).astype(np.int64)
            if s.stage is Stage.CONTRACT:
                fast = s.column(ContractInputs(t, c, CATALOG, table.bounds, EVERY)).at(gpus)
                ref = s.reference(ContractInputs(t, c, CATALOG, table.bounds, gpus))
            elif s.stage is Stage.TICK:
                fast = s.column(TickInputs(snap, th, EVERY, rows)).at(gpus)
                ref = s.reference(TickInputs(snap, th, gpus, rows[gpus]))
            else:
                full = s.column(TickContractInputs(snap, c, table=path_table(snap, th, node)))
                fast = dataclasses.replace(full.at(gpus), extra=tuple((svc, eps, b[gpus], lat[gpus])
                                                                      for svc, eps, b, lat in full.extra))
                ref = s.reference(TickContractInputs(snap, c, tick=TickInputs(snap, th, gpus, rows[gpus])))
            _same(fast, ref, f"{name} / {cname} / {k} candidates")
            exercised |= any(a is not None and bool(a.any()) for a in (ref.fail, ref.latency, ref.stale))
    assert exercised, f"the world never exercised {name}"


def test_the_registry_is_the_order_and_every_signal_file_is_registered() -> None:
    assert ORDER == tuple(s.constraint for s in SIGNALS)
    assert len(set(ORDER)) == len(ORDER) and len(REGISTRY) == len(SIGNALS)
    assert NO_FAILURE == len(ORDER) and all(CODE[c] == i for i, c in enumerate(ORDER))
    assert {s.stage for s in SIGNALS} == set(Stage)
    for s in SIGNALS:
        assert BY_CONSTRAINT[s.constraint] is s and REGISTRY[s.name] is s
        assert isinstance(s.consumes, tuple)
    assert of_stage(Stage.TICK) == tuple(s for s in SIGNALS if s.stage is Stage.TICK)
    for info in pkgutil.iter_modules(signals_pkg.__path__):
        mod = importlib.import_module(f"{signals_pkg.__name__}.{info.name}")
        mine = [v for v in vars(mod).values()
                if isinstance(v, type) and issubclass(v, Signal) and v is not Signal and v.__module__ == mod.__name__]
        assert len(mine) == 1, f"signals/{info.name}.py declares one signal"
        assert any(type(s) is mine[0] for s in SIGNALS), f"signals/{info.name}.py is not registered in SIGNALS"
    assert Constraint.LATENCY_BUDGET in ORDER and Constraint.INTERNAL not in ORDER


_finite = st.floats(min_value=0.0, max_value=2.0, allow_nan=False)
_row = st.tuples(
    st.floats(min_value=0.0, max_value=1.0), _finite, st.booleans(),  # min share, peak x eff (x1e14), no peak
    st.one_of(st.floats(min_value=-0.3, max_value=1.5), st.just(float("nan"))),  # free share
    st.floats(min_value=0.0, max_value=0.05), st.floats(min_value=0.0, max_value=0.01),  # network, dependencies
    st.floats(min_value=0.0, max_value=0.01), st.floats(min_value=0.0, max_value=0.05),  # sigma, measured wait
    st.sampled_from([int(NO_FAILURE), *range(len(ORDER))]),  # the tables' code
    st.floats(min_value=0.0, max_value=0.4),  # reserved
)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_row, min_size=1, max_size=12), limit=st.floats(min_value=0.0, max_value=0.2),
       flops=st.floats(min_value=1e9, max_value=1e13))
def test_the_scalar_request_arithmetic_equals_the_request_signals(rows, limit: float, flops: float) -> None:  # type: ignore[no-untyped-def]
    """`scalar_rows` (the share and budget signals unrolled per candidate on Python floats)
    refuses what the signals' vectorised filters refuse, over the reference's arithmetic."""
    lay = Layout(0)
    block, reserved = [], []
    for ms, pe, np_, free, net, dep, sig, wait, code, res in rows:
        r = [0.0] * lay.width
        r[0:9] = [ms, pe * 1e14, float(np_), free, net, net, dep, sig, wait]
        r[lay.code], r[lay.port] = float(code), 0.0
        block.append(tuple(r))
        reserved.append(res)
    with np.errstate(all="ignore"):  # a zero peak: numpy's inf, as the tables give it
        got = [o[4] for o in scalar_rows(lay, block, reserved, flops, limit, 2.0)]

    a = np.array(block)
    free = a[:, 3] - np.array(reserved)
    min_share = a[:, 0]
    share_used = np.clip(np.maximum(free, min_share), LEAST_SHARE, 1.0)
    with np.errstate(all="ignore"):
        compute = np.where(a[:, 2] != 0.0, np.inf, compute_seconds(flops, a[:, 1], share_used))
        total = a[:, 4] + (gpu_queue(1.0 - free) + a[:, 8]) + compute + a[:, 6]
    x = RequestInputs(free, min_share, total, limit)
    code = a[:, lay.code].astype(np.int64)
    for s in of_stage(Stage.REQUEST):
        col = s.reference(x)
        assert col.fail is not None
        code = np.minimum(code, np.where(col.fail, CODE[s.constraint], NO_FAILURE))
    assert got == np.where(code == NO_FAILURE, -1, code).tolist()
