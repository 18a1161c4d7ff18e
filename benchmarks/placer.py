"""Placer benchmark: refresh latency per tick, placement latency, and a tail-latency
simulation of contract-aware placement vs round-robin vs least-loaded under one scripted
congestion event script.

    .venv/bin/python benchmarks/placer.py [--quick] [--plot benchmarks/placer_tail.png] [--against REV]

Baselines measured in the same run: the naive refresh (writing every tick's telemetry into
the networkx graph) and naive placement (networkx Dijkstra over the full graph per request).
The tail simulation reports predicted end-to-end latency (the model on the snapshot each
placement saw: the issue's measure) and realised latency (the model on the next tick's true
state, plus noise), and the contract-aware placer without and with the bundle's request
budget breakers (`policies/breakers.contract`: `slo-budget` at several fractions of the SLO,
and `slow-placement`, at three times the latency the placement predicted); the baselines have no
breaker. `--against REV` also times `Placer.place` against the placer at
a git revision, in paired rounds; `--pick-against REV` times only `Picker.choose` (the
request-stage signals on, 2 to 64 candidates) against the picker at REV.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, NamedTuple

import networkx as nx
import numpy as np

from policyc.compiler.bundle import (
    Breaker, Bundle, Compute, Contract, Dependencies, Interval, Memory, Redirect, ServiceDependency, Slo, SourceRef,
)
from policyc.compiler.pipeline import compile_paths
from policyc.enforcer.rule_table import ELAPSED, RuleTable, build_rule_table
from policyc.matcher.instance import Instance
from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster, Thresholds
from policyc.placer.catalog import DEFAULT_CATALOG, catalog_by_name
from policyc.placer.evaluate import evaluate
from policyc.placer import lookup as lookup_module
from policyc.placer import placer as placer_module
from policyc.placer.contract_table import contract_table
from policyc.placer.paths import path_table
from policyc.placer.shares import share_bounds
from policyc.placer.tick_table import tick_table
from policyc.placer.snapshot import build_snapshot

POLICIES = Path(__file__).resolve().parent.parent / "policies"
REF = SourceRef(file="benchmarks/placer.py", line=1, col=1)
BUDGET = 0.2
INGRESS = "ingress/us-west"
PERMISSIVE = Thresholds(max_port_watermark=1.0, max_port_util=1.0, max_switch_watermark=1.0, max_link_util=1.0,
                        max_pcie_util=1.0, min_health=0.0)


def contract(flops: float = 1.2e13, proxy: str = "dedicated") -> Contract:
    return Contract(
        name="recommender", version="1", compute=Compute(flops=Interval(lo=flops * 0.8, hi=flops), per="request", tokens=128),
        memory=Memory(bandwidth_min=80e9, burst_max=0.2),
        dependencies=Dependencies(services=(ServiceDependency(name="cache", kind="redis", p99=5e-3, proxy=proxy, origin=REF),)),
        slo=Slo(latency=BUDGET, allowance=0.03), origin=REF,
    )


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


# ----------------------------------------------------------------------------- refresh


def bench_refresh(hosts: int, ticks: int) -> dict[str, float]:
    sim = SimulatedCluster(seed=1, hosts=hosts, gpus_per_host=8)
    r = Refresher(sim, interval=0.2)
    for _ in range(ticks):
        r.tick()
    lat = [x * 1e3 for x in r.latencies()[1:]]
    # the naive way: every tick's telemetry written into the networkx graph
    naive = []
    for _ in range(3):
        t0 = time.perf_counter()
        r.current().graph()
        naive.append((time.perf_counter() - t0) * 1e3)
    # the threaded collector at its real 200 ms cadence
    r2 = Refresher(SimulatedCluster(seed=2, hosts=hosts, gpus_per_host=8), interval=0.2)
    r2.start()
    time.sleep(2.0)
    r2.stop()
    return {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat), "naive": statistics.median(naive),
            "threaded_ticks": len(r2.latencies()), "overruns": r2.overruns}


# ----------------------------------------------------------------------------- placement


def fleet(sim: SimulatedCluster, region: str) -> list[Instance]:
    return [Instance(id=f"rec@{s.host}/{s.gpu}", model="recommender", deployment=s.to_deployment())
            for s in sim.gpu_slots() if s.region == region]


def bench_place(hosts: int, n: int, k: int, threaded_s: float) -> dict[str, float]:
    """Placement latency: sequential on a simulated clock (100 placements per 200 ms tick,
    so snapshots are fresh and reservations reset), as wall and thread-CPU time; the
    reference per-request evaluation on the same candidates (the pre-table path); and wall
    time with the refresher thread ticking alongside at its real 200 ms cadence."""
    sim = SimulatedCluster(seed=3, hosts=hosts, gpus_per_host=8)
    now = [0.0]
    r = Refresher(sim, clock=lambda: now[0])
    placer = Placer(r, clock=lambda: now[0])
    c = contract()
    insts = fleet(sim, "us-west")
    rng = np.random.default_rng(0)
    sets = [[insts[j] for j in rng.choice(len(insts), k, replace=False)] for _ in range(min(n, 500))]
    r.tick()
    for cands in sets[:20]:  # warm-up: contract table, first-use code paths
        placer.place(cands, BUDGET, c, ingress=INGRESS)
    wall, cpu, refused = [], [], 0
    for i in range(n):
        if i % 100 == 99:
            now[0] += 0.2
            r.tick()
        cands = sets[i % len(sets)]
        t0, c0 = time.perf_counter(), time.thread_time()
        plan = placer.place(cands, BUDGET, c, ingress=INGRESS)
        cpu.append((time.thread_time() - c0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
        refused += not isinstance(plan, PlacementPlan)
    # baseline, same run: the reference per-request evaluation over the same candidates
    snap = r.current()
    t = snap.topology
    catalog = catalog_by_name(DEFAULT_CATALOG)
    bounds = share_bounds(c, {g.model for g in t.gpus}, catalog)
    row = snap.fabric_rows[t.fabric_index[INGRESS]]
    ref_wall, ref_cpu = [], []
    for cands in sets[: max(100, n // 4)]:
        t0, c0 = time.perf_counter(), time.thread_time()
        gpus = np.array([t.gpu_index[(x.deployment.host, x.deployment.gpu)] for x in cands], dtype=np.int64)
        ev = evaluate(snap, snap.thresholds, gpus, bounds, catalog, c, BUDGET, np.full(len(gpus), row), np.zeros(len(gpus)))
        feasible = np.nonzero(ev.fail < 0)[0]
        if len(feasible):
            int(feasible[np.argmin(ev.rank[feasible])])
        ref_cpu.append((time.thread_time() - c0) * 1e3)
        ref_wall.append((time.perf_counter() - t0) * 1e3)
    g = snap.graph()
    for u, v, d in g.edges(data=True):
        d["w"] = d.get("latency", 1e-6) * (1 + 10 * d.get("watermark", 0.0))
    naive = []
    for _ in range(3):
        t0 = time.perf_counter()
        nx.single_source_dijkstra_path_length(g, INGRESS, weight="w")
        naive.append((time.perf_counter() - t0) * 1e3)
    # with the collector thread running: real clock, one request per ~millisecond
    live = bench_live(hosts, sets, c, threaded_s)
    return {"p50": pct(wall, 50), "p99": pct(wall, 99), "cpu_p50": pct(cpu, 50), "cpu_p99": pct(cpu, 99),
            "ref_p50": pct(ref_wall, 50), "ref_p99": pct(ref_wall, 99), "ref_cpu_p50": pct(ref_cpu, 50),
            "naive": statistics.median(naive), "k": k, "n": n, "refused": refused,
            "live": live_figures(live)}


def bench_live(hosts: int, sets: list[list[Instance]], c: Contract, seconds: float) -> dict[str, list]:
    """Placements on the real clock, one about every millisecond, while a refresher thread
    ticks at 200 ms in the same process: per placement its wall time, its thread CPU time,
    and whether it overlapped a refresh (the refresher's own spans)."""
    r = Refresher(SimulatedCluster(seed=3, hosts=hosts, gpus_per_host=8), interval=0.2)
    p = Placer(r)
    r.tick()
    r.start()
    rows, stale, end, i = [], 0, time.monotonic() + seconds, 0
    while time.monotonic() < end:
        t0, c0 = time.perf_counter(), time.thread_time()
        plan = p.place(sets[i % len(sets)], BUDGET, c, ingress=INGRESS)
        rows.append((t0, time.perf_counter(), time.thread_time() - c0))
        stale += plan.stale
        i += 1
        time.sleep(0.001)
    r.stop()
    spans = r.spans()[1:]
    lo, hi = np.array([a for a, _ in spans]), np.array([b for _, b in spans])
    over = [bool(((lo < b) & (hi > a)).any()) for a, b, _ in rows]
    return {"wall": [(b - a) * 1e3 for a, b, _ in rows], "cpu": [x * 1e3 for _, _, x in rows], "over": over,
            "stale": [stale], "refresh": [(b - a) * 1e3 for a, b in spans]}


def live_figures(v: dict[str, list]) -> dict[str, float]:
    """Wall percentiles over all placements, and split by whether they overlapped a refresh;
    `wait` is wall minus thread CPU time (waiting for the GIL, or preempted)."""
    wall, over = np.array(v["wall"]), np.array(v["over"], dtype=bool)
    wait = wall - np.array(v["cpu"])
    q = lambda xs, p: pct(list(xs), p) if len(xs) else float("nan")  # noqa: E731
    return {"n": len(wall), "p50": q(wall, 50), "p90": q(wall, 90), "p99": q(wall, 99), "overlap": float(over.mean()) if len(over) else 0.0,
            "over_p50": q(wall[over], 50), "over_p90": q(wall[over], 90), "over_wait_p90": q(wait[over], 90),
            "rest_p99": q(wall[~over], 99), "rest_wait_p99": q(wait[~over], 99), "stale": sum(v["stale"]),
            "ticks": len(v["refresh"]), "refresh_p50": q(v["refresh"], 50)}


def timed_places(placer: Any, refresher: Any, now: list[float], sets: list[list[Instance]], c: Contract,
                 n: int) -> tuple[float, int]:
    """Thread CPU µs per placement over `n` placements cycling through `sets` (wall time on
    this shared machine is mostly preemption), with a refresher tick every 1,000 placements
    (a 200 ms tick at 5,000 decisions/s) on the fake clock `now`, its cost not counted; and
    how many were refused. Takes today's placer or one from `placer_at`."""
    ticks, refused = 0.0, 0
    c0 = time.thread_time()
    for i in range(n):
        if i % 1000 == 999:
            t1 = time.thread_time()
            now[0] += 0.2
            refresher.tick()
            ticks += time.thread_time() - t1
        refused += not placer.place(sets[i % len(sets)], BUDGET, c, ingress=INGRESS).feasible
    return (time.thread_time() - c0 - ticks) / n * 1e6, refused


def bench_tight(hosts: int, n: int, k: int, rounds: int) -> dict[str, float]:
    """`Placer.place` in a tight loop (thread CPU time) with the decision path's handful of candidates, the
    numpy-only path (SCALAR_MAX = 0: the code before the scalar path) against the scalar
    path, alternating rounds in the same run; a tick every 1,000 placements (a 200 ms tick
    at 5,000 decisions/s), its cost not counted but the first request's table builds are.
    Also: `lookup` alone on one candidate set, and the cost of building the per-(tick,
    contract) table with its block."""
    sim = SimulatedCluster(seed=3, hosts=hosts, gpus_per_host=8)
    now = [0.0]
    r = Refresher(sim, clock=lambda: now[0])
    r.tick()
    placer = Placer(r, clock=lambda: now[0])
    c = contract()
    insts = fleet(sim, "us-west")
    rng = np.random.default_rng(0)
    sets = [[insts[j] for j in rng.choice(len(insts), k, replace=False)] for _ in range(200)]

    refused = [0]

    def loop() -> float:
        us, no = timed_places(placer, r, now, sets, c, n)
        refused[0] += no
        return us

    def modes(m: int) -> None:
        lookup_module.SCALAR_MAX = placer_module.SCALAR_MAX = m

    snap = r.current()
    t = snap.topology
    table = contract_table(c, t, catalog_by_name(DEFAULT_CATALOG))
    node = t.fabric_index[INGRESS]
    gpus = np.array([t.gpu_index[(x.deployment.host, x.deployment.gpu)] for x in sets[0]], dtype=np.int64)
    zero = np.zeros(len(gpus))
    out: dict[str, list[float]] = {"numpy": [], "scalar": [], "lookup_numpy": [], "lookup_scalar": []}
    default = lookup_module.SCALAR_MAX
    try:
        for _ in range(rounds):
            for name, m in (("numpy", 0), ("scalar", default)):
                modes(m)
                out[name].append(loop())
                c0 = time.thread_time()
                for _ in range(2000):
                    lookup_module.lookup(snap, snap.thresholds, gpus, node, table, zero, BUDGET)
                out["lookup_" + name].append((time.thread_time() - c0) / 2000 * 1e6)
    finally:
        modes(default)
    pt = path_table(snap, snap.thresholds, node)
    build = []
    for _ in range(5):
        pt.contracts.clear()
        t0 = time.perf_counter()
        tick_table(snap, pt, table)
        build.append((time.perf_counter() - t0) * 1e3)
    res = {name: min(v) for name, v in out.items()}  # best round: the machine is shared
    res["paired"] = statistics.median(a / b for a, b in zip(out["numpy"], out["scalar"]))  # round by round
    res["table_ms"] = min(build)
    res["refused"] = refused[0] / (2 * rounds * n)
    return res


def placer_at(rev: str):
    """The `placer/` package as it was at git revision `rev`, importable next to today's
    (its own imports are relative; what it takes from other packages is today's)."""
    import importlib
    import subprocess
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="placer-at-"))
    name = "placer_at_" + "".join(ch for ch in rev if ch.isalnum())
    tar = subprocess.run(["git", "-C", str(POLICIES.parent), "archive", rev, "placer"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=tar, check=True)
    (root / "placer").rename(root / name)
    sys.path.insert(0, str(root))
    return importlib.import_module(name)


def bench_against(rev: str, hosts: int, n: int, rounds: int) -> dict[int, dict[str, float]]:
    """`Placer.place` today against the placer at `rev`, same requests, paired rounds in the
    same run (thread CPU time per placement, a tick every 1,000 placements not counted)."""
    old_mod = placer_at(rev)
    import policyc.placer as new_mod

    c = contract()
    out: dict[int, dict[str, float]] = {}
    for k in (8, 64):
        envs = {}
        for name, mod in (("before", old_mod), ("after", new_mod)):
            sim = mod.SimulatedCluster(seed=3, hosts=hosts, gpus_per_host=8)
            now = [0.0]
            r = mod.Refresher(sim, clock=lambda now=now: now[0])
            r.tick()
            p = mod.Placer(r, clock=lambda now=now: now[0])
            insts = fleet(sim, "us-west")
            rng = np.random.default_rng(0)
            envs[name] = (now, r, p, [[insts[j] for j in rng.choice(len(insts), k, replace=False)] for _ in range(200)])

        def loop(name: str, count: int) -> float:
            now, r, p, sets = envs[name]
            return timed_places(p, r, now, sets, c, count)[0]

        for name in envs:
            loop(name, 300)
        got: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(rounds):
            for name in got:
                got[name].append(loop(name, n))
        out[k] = {"before": min(got["before"]), "after": min(got["after"]),
                  "paired": statistics.median(a / b for a, b in zip(got["before"], got["after"]))}
    return out


def bench_pick(rev: str, hosts: int, n: int, rounds: int) -> dict[tuple[str, int], dict[str, float]]:
    """`Picker.choose` alone today against the picker at `rev`, paired rounds in the same run
    (thread CPU µs per pick), on 2, 8, 32 and 64 feasible candidates, with the request-stage
    signals on: this gateway's requests in flight on some candidates ("in flight": the
    gateway's gRPC path), and also an LLM request's facts ("llm": prefix held on two
    candidates, a TTFT SLO, four model servers' readings, an `llm` contract)."""
    import importlib

    from policyc.compiler.bundle import Llm

    old_mod = placer_at(rev)
    import policyc.placer as new_mod

    base = contract()
    llm_c = base.model_copy(update={"llm": Llm(prefill_flops=50e-6 * base.compute.efficiency * 989e12,
                                                decode_flops=1e6, context=8192)})
    catalog = {g.name: g for g in DEFAULT_CATALOG}
    out: dict[tuple[str, int], dict[str, float]] = {}
    for case in ("in flight", "llm"):
        for k in ((2, 8, 32, 64) if case == "in flight" else (32, 64)):
            envs = {}
            for name, mod in (("before", old_mod), ("after", new_mod)):
                sub = {m: importlib.import_module(f"{mod.__name__}.{m}") for m in ("pick", "evaluated", "request_facts", "readings")}
                t = mod.SimulatedCluster(seed=3, hosts=hosts, gpus_per_host=8).topology()
                rng = np.random.default_rng(k)
                rows = rng.choice(len(t.gpus), k, replace=False)

                class Cands(sub["evaluated"].Evaluated):  # the lists the choice reads; nothing else is
                    __slots__ = ()

                    def row(self, r: int, snap: Any, sites: Any) -> Any:
                        raise AssertionError

                    def evaluation(self) -> Any:
                        raise AssertionError

                ev = Cands(rows, [-1] * k, (0.02 + 0.01 * rng.random(k)).tolist())
                picker = sub["pick"].Picker()
                # an LLM request's in flight with its prediction, where the tree has the first token's terms
                learns = case == "llm" and hasattr(picker.in_flight, "first_token")
                for i in range(8):  # eight requests in flight (on the first eight candidates), three of them ended
                    picker.in_flight.begin(f"d{i}", t.gpu_keys[int(rows[i % k])], *((0.05,) if learns else ()))
                if learns:  # five first tokens measured (an overhead learned on each GPU), three still prefilling
                    for i in range(5):
                        picker.in_flight.first_token(f"d{i}", 0.08)
                for i in range(3):
                    picker.in_flight.end(f"d{i}")
                facts = None
                readings: dict[str, Any] = {}
                if case == "llm":
                    prompt = tuple(range(1, 21))
                    for g in rows[10:12]:
                        picker.prefixes.record(prompt, t.gpu_keys[int(g)])
                    readings = {t.gpu_keys[int(g)]: sub["readings"].Reading({"queue_depth": 1.0, "kv_cache_usage": 0.3}, 0.05)
                                for g in rows[8:12]}
                    facts = sub["request_facts"].RequestFacts(prompt, 1000.0, 0.2)
                envs[name] = (picker, t, ev, readings, facts, sub["request_facts"].CURRENT)

            def loop(name: str, count: int) -> float:
                picker, t, ev, readings, facts, current = envs[name]
                c = llm_c if facts is not None else base
                token = current.set(facts)
                try:
                    c0 = time.thread_time()
                    for i in range(count):
                        picker.choose(t, ev, c, None, f"key{i % 4}", readings, catalog)
                    return (time.thread_time() - c0) / count * 1e6
                finally:
                    current.reset(token)

            for name in envs:
                loop(name, 200)
            got: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(rounds):
                for name in got:
                    got[name].append(loop(name, n))
            out[(case, k)] = {"before": min(got["before"]), "after": min(got["after"]),
                              "paired": statistics.median(a / b for a, b in zip(got["before"], got["after"]))}
    return out


# ----------------------------------------------------------------------------- tail simulation


def script(sim: SimulatedCluster, ticks: int, seed: int) -> tuple[list[tuple[int, str]], set[int]]:
    """The congestion script, identical for every policy (same seed, same targets): the
    labelled events, and every tick at which some event starts (background flares too)."""
    rng = np.random.default_rng(seed)
    t = sim.topology()
    west_hosts = [h.name for h in t.hosts if h.region == "us-west"]
    west_gpus = [f"{s.host}/{s.gpu}" for s in sim.gpu_slots() if s.region == "us-west"]
    racks = sorted({n for n in t.fabric_nodes if n.startswith("us-west/rack-")})
    marks = []
    T = lambda f: max(1, int(ticks * f))  # noqa: E731
    hot = [h for h in west_hosts[: max(2, len(west_hosts) // 6)]]
    for h in hot:  # a rack's worth of RDMA ports climbs to 89 %
        for p in ("mlx5_0", "mlx5_1"):
            sim.submit(_ev(sim, "watermark", f"{h}/{p}", 0.89, T(0.3)), at_tick=T(0.1))
    marks.append((T(0.1), "rack ports at 89 %"))
    for g in rng.choice(west_gpus, max(1, len(west_gpus) // 20), replace=False):
        sim.submit(_ev(sim, "sm_collapse", str(g), 0.15, T(0.4)), at_tick=T(0.2))
    marks.append((T(0.2), "5 % of GPUs: SM collapse to 15 %"))
    sim.submit(_ev(sim, "service_p99", "redis-us-west", 0.8, T(0.3)), at_tick=T(0.35))
    marks.append((T(0.35), "redis-us-west p99 800 ms"))
    leaf = racks[0] if racks else None
    if leaf:
        for s in (n for n in t.fabric_nodes if n.startswith("us-west/spine-")):
            sim.submit(_ev(sim, "link_down", f"{leaf}|{s}", 0.0, T(0.2)), at_tick=T(0.5))
        marks.append((T(0.5), f"{leaf} uplinks down"))
    starts = {T(0.1), T(0.2), T(0.35), T(0.5)}
    for start in range(T(0.05), ticks, max(1, T(0.1))):  # background: random ports flare up
        starts.add(start)
        for p in rng.choice(len(t.ports), max(4, len(t.ports) // 50), replace=False):
            sim.submit(_ev(sim, "watermark", t.port_key(int(p)), float(rng.uniform(0.82, 0.97)), max(1, T(0.05))), at_tick=start)
    return marks, starts


def _ev(sim: SimulatedCluster, kind: str, target: str, value: float, ticks: int):
    from policyc.placer.events import Event, EventKind

    return Event(EventKind(kind), target, value, ticks)


def end_to_end(state, gpu: int, c: Contract, rng: np.random.Generator | None, catalog) -> float:
    """A request's end-to-end latency on `gpu` by the latency model on `state` (no
    thresholds), a collapsed GPU computing at its collapsed rate; unreachable, the request
    times out at twice the budget.

    Realised: `state` is the *next* tick's true state and `rng` adds noise of the predicted
    spread. Predicted: `state` is the snapshot the placement saw and no `rng`, the same for
    every policy's choice: the measure the issue names ("the P99 of predicted end-to-end
    latency"), blind, as every placement is, to what happens after the snapshot."""
    t = state.topology
    bounds = share_bounds(c, {t.gpus[gpu].model}, catalog)
    ev = evaluate(state, PERMISSIVE, np.array([gpu]), bounds, catalog, c, BUDGET,
                  np.array([state.fabric_rows[t.fabric_index[INGRESS]]]), np.zeros(1))
    total = float(ev.total[0])
    if not np.isfinite(total):
        return 2 * BUDGET
    if state.gpu_collapsed[gpu]:
        total += float(ev.compute[0]) * (1 / 0.25 - 1)
    if rng is None:
        return total
    return max(0.0, total + float(ev.sigma[0]) * float(rng.standard_normal()))


BREAKER_FRACTIONS = (0.925, 0.75, 0.5)  # policies/breakers.contract's slo-budget rule (92.5 %), then tighter ones


class TailBreaker(NamedTuple):
    """A request-scope budget rule as the tail simulation applies it: `label` for the report,
    the enforcer's rule table it was lowered to (which says when it fires for a request
    given its predicted latency, as the guardian arms it), and its retry budget share."""

    label: str
    table: RuleTable
    share: float

    def fires_after(self, model: str, predicted: float) -> float:
        found = self.table.budget_for(model, predicted)
        assert found is not None
        return found[1]


def budget_breakers(c: Contract, fractions: tuple[float, ...]) -> list[TailBreaker]:
    """The request-scope budget rules of `policies/breakers.contract`, applied to this
    contract and lowered by the enforcer's own rule table: `slo-budget` (elapsed >= 92.5 % of
    the SLO -> cancel the stream, redirect with X-Retry-Count: 1, report the GPU) at each
    fraction, then `slow-placement` (elapsed >= 300 % of the latency the placement predicted,
    the same actions) as the policy writes it."""
    compiled = compile_paths([str(POLICIES)], analyse=False).bundle

    def rule_on(of: str) -> Breaker:
        rule = next(b for b in compiled.breakers if b.scope == "request" and any(x.signal == ELAPSED and x.of == of for x in b.conditions))
        assert any(isinstance(a, Redirect) for a in rule.actions), f"`{rule.name}` redirects to a backup"
        return rule

    def lowered(b: Breaker) -> RuleTable:
        return build_rule_table(Bundle(compiler_version="bench", contracts=(c,), breakers=(b.model_copy(update={"models": (c.name,)}),)))

    slo_rule, predicted_rule = rule_on("slo"), rule_on("predicted")
    out = []
    for f in fractions:
        cond = next(x for x in slo_rule.conditions if x.signal == ELAPSED).model_copy(update={"value": f})
        table = lowered(slo_rule.model_copy(update={"conditions": (cond,)}))
        out.append(TailBreaker(f"`{slo_rule.name}` at {f:.1%} of the SLO ({table.budget_for(c.name)[1] * 1e3:.0f} ms)",  # type: ignore[index]
                               table, slo_rule.retry_budget))
    factor = next(x.value for x in predicted_rule.conditions if x.of == "predicted")
    out.append(TailBreaker(f"`{predicted_rule.name}` at {factor:.0%} of the predicted latency",
                           lowered(predicted_rule), predicted_rule.retry_budget))
    return out


class _Pinned:
    """A snapshot provider that serves a given snapshot: a retry is placed on the snapshot
    that is current when the breaker fires, not the one the request was first placed on."""

    def __init__(self, r: Refresher) -> None:
        self._r = r
        self.snap = None

    def current(self):
        return self.snap if self.snap is not None else self._r.current()

    def report_anomaly(self, host: str, gpu: str, signal: str, value: float) -> bool:
        return self._r.report_anomaly(host, gpu, signal, value)


def broken(placed: list[tuple[int, list[Instance], float, float]], lat: list[float], breaker: TailBreaker,
           retry: Placer, pinned: _Pinned, snap, nxt, truth, c: Contract, rng: np.random.Generator, catalog,
           ) -> tuple[list[float], int, int]:
    """Realised latencies (ms) of one tick's requests with a budget breaker: a request still
    running when the rule fires for it (a fixed budget, or a share of the latency its
    placement predicted) is cancelled and redirected once (retry budget permitting) to a
    backup GPU placed by the placer among its other candidates, on the snapshot current at
    that moment (the next one when the request started late enough in the tick); it then
    takes that time + the backup's realised latency. The backup is not itself broken again.
    Returns the latencies, the retries, and the needless ones (requests broken that would
    have finished within the SLO: what an eager rule costs)."""
    out, retries, needless = list(lat), 0, 0
    cap = int(breaker.share * len(placed))
    t = snap.topology
    for i, ((g, cands, started, predicted), v) in enumerate(zip(placed, lat)):
        at = breaker.fires_after(c.name, predicted)
        if v < at * 1e3 or retries >= cap:
            continue
        retries += 1
        needless += v <= BUDGET * 1e3
        pinned.snap = nxt if started + at >= snap.interval else snap
        others = [x for x in cands if t.gpu_index[(x.deployment.host, x.deployment.gpu)] != g]
        plan = retry.place(others, BUDGET, c, ingress=INGRESS)
        if not isinstance(plan, PlacementPlan):
            out[i] = 2 * BUDGET * 1e3  # cancelled with nowhere to go: the request fails at the timeout
            continue
        g2 = t.gpu_index[(plan.host, plan.gpu)]
        out[i] = (at + end_to_end(truth, g2, c, rng, catalog)) * 1e3
    pinned.snap = None
    return out, retries, needless


def bench_tail(hosts: int, ticks: int, per_tick: int, k: int) -> dict[str, dict]:
    catalog = catalog_by_name(DEFAULT_CATALOG)
    out: dict[str, dict] = {}
    for policy in ("contract-aware", "round-robin", "least-loaded"):
        # the contract-aware placer binds the cache to the dedicated proxy the policy asks for;
        # the baselines know nothing of dependencies and call Redis directly (the incident)
        c = contract(proxy="dedicated" if policy == "contract-aware" else "none")
        refused = 0
        sim = SimulatedCluster(seed=42, hosts=hosts, gpus_per_host=8)
        marks, starts = script(sim, ticks, seed=9)
        r = Refresher(sim)
        placer = Placer(r)
        # each breaker (contract-aware only: the baselines have none) places its retries with
        # a placer of its own on the same snapshots, so the run without them is the same run
        breakers = budget_breakers(c, BREAKER_FRACTIONS) if policy == "contract-aware" else []
        pinned = _Pinned(r)
        retries_placed = [Placer(pinned) for _ in breakers]  # one each: a placer's hysteresis must not carry between rules
        retry_rng = [np.random.default_rng(7) for _ in breakers]
        start_rng = np.random.default_rng(8)
        insts = fleet(sim, "us-west")
        t = sim.topology()
        rng = np.random.default_rng(5)
        noise = np.random.default_rng(6)
        rr = 0
        per: list[list[float]] = []
        per_predicted: list[list[float]] = []
        per_b: list[list[list[float]]] = [[] for _ in breakers]
        retries = [[0, 0] for _ in breakers]
        r.tick()
        for _ in range(ticks):
            snap = r.current()
            chosen: list[int] = []
            placed: list[tuple[int, list[Instance], float, float]] = []
            for _ in range(per_tick):
                cands = [insts[j] for j in rng.choice(len(insts), k, replace=False)]
                predicted = float("nan")  # the baselines predict nothing (and have no breakers)
                if policy == "contract-aware":
                    plan = placer.place(cands, BUDGET, c, ingress=INGRESS)
                    if not isinstance(plan, PlacementPlan):
                        refused += 1  # refused up front (redirected), not served late
                        continue
                    inst = next(x for x in cands if x.id == plan.instance_id)
                    predicted = plan.latency.total
                elif policy == "round-robin":
                    inst, rr = cands[rr % k], rr + 1
                else:
                    idx = [t.gpu_index[(x.deployment.host, x.deployment.gpu)] for x in cands]
                    inst = cands[int(np.argmin(snap.gpu_rho[idx]))]
                g = t.gpu_index[(inst.deployment.host, inst.deployment.gpu)]
                chosen.append(g)
                if breakers:
                    placed.append((g, cands, float(start_rng.uniform(0.0, snap.interval)), predicted))
                sim.occupy(t.gpu_key(g), 0.05, ticks=3)
            seen = build_snapshot(snap.version, t, snap.frame, None, None, PERMISSIVE, 0.2, snap.taken_at)
            per_predicted.append([end_to_end(seen, g, c, None, catalog) * 1e3 for g in chosen])
            nxt = r.tick()
            truth = build_snapshot(nxt.version, t, nxt.frame, None, None, PERMISSIVE, 0.2, nxt.taken_at)
            lat = [end_to_end(truth, g, c, noise, catalog) * 1e3 for g in chosen]
            per.append(lat)
            for j, b in enumerate(breakers):
                vals, n, needless = broken(placed, lat, b, retries_placed[j], pinned, snap, nxt, truth, c, retry_rng[j], catalog)
                per_b[j].append(vals)
                retries[j][0] += n
                retries[j][1] += needless
        # series[i] was placed on snapshot i + 1 and realised on tick i + 2: an event starting
        # on tick s hits series[s - 2], placed before any snapshot could show it
        onset = {s - 2 for s in starts if 0 <= s - 2 < ticks}
        out[policy] = dict(_tail_figures(per, onset), marks=marks, refused=refused, onset_ticks=len(onset),
                           predicted=_tail_figures(per_predicted, onset))
        out[policy]["breakers"] = [dict(_tail_figures(pb, onset), label=b.label, retries=n, needless=needless)
                                   for pb, b, (n, needless) in zip(per_b, breakers, retries)]
    return out


def _tail_figures(per: list[list[float]], onset: set[int]) -> dict:
    """P99, P50, the spread (population standard deviation) of the per-tick P99 with and
    without the onset ticks, and the share over budget."""
    p99s = [pct(x, 99) for x in per]
    allv = [v for x in per for v in x]
    steady = [v for i, v in enumerate(p99s) if i not in onset]
    return {"p99": pct(allv, 99), "p50": pct(allv, 50), "spread": statistics.pstdev(p99s),
            "spread_steady": statistics.pstdev(steady), "series": p99s,
            "over_budget": sum(v > BUDGET * 1e3 for v in allv) / max(1, len(allv))}


def plot(tail: dict[str, dict], path: str, ticks: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, ax) = plt.subplots(2, 1, figsize=(9, 10), sharex=True, height_ratios=(1, 1.4))
    x = range(1, ticks + 1)
    for name, d in tail.items():
        pr = d["predicted"]
        top.plot(x, pr["series"], label=f"{name}: P99 {pr['p99']:.0f} ms, ±{pr['spread']:.1f} ms")
        ax.plot(x, d["series"], label=f"{name}: P99 {d['p99']:.0f} ms, ±{d['spread']:.1f} ms")
    for b in tail["contract-aware"]["breakers"]:
        ax.plot(x, b["series"], ls="--", lw=0.9,
                label=f"contract-aware + breaker {b['label']}: P99 {b['p99']:.0f} ms, ±{b['spread']:.1f} ms")
    for panel in (top, ax):
        panel.set_yscale("log")
        for tick, label in next(iter(tail.values()))["marks"]:
            panel.axvline(tick, color="grey", lw=0.6, ls=":")
            panel.text(tick, panel.get_ylim()[1] * 0.97, label, rotation=90, fontsize=7, va="top")
    top.set_title("Placement under scripted congestion (same event script for each policy)")
    top.set_ylabel("per-tick P99, predicted (ms)")
    top.legend(fontsize=7, loc="lower right", frameon=False)
    ax.set_xlabel("tick (200 ms)")
    ax.set_ylabel("per-tick P99, realised (ms)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=1, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller tail simulation and fewer samples")
    ap.add_argument("--plot", default="", help="write the tail-latency plot to this PNG")
    ap.add_argument("--against", default="", metavar="REV",
                    help="also time Placer.place against the placer at this git revision (paired rounds)")
    ap.add_argument("--pick-against", default="", metavar="REV",
                    help="only time Picker.choose (2/8/32/64 candidates, request-stage signals on) against the picker at REV")
    a = ap.parse_args()
    if a.pick_against:
        for (case, kk), v in bench_pick(a.pick_against, 1000, 2000 if a.quick else 5000, 5 if a.quick else 7).items():
            print(f"Picker.choose, {kk} candidates, {case}, against {a.pick_against} (thread CPU, best of paired rounds): "
                  f"before {v['before']:.1f} us, after {v['after']:.1f} us -> ratio {v['before'] / v['after']:.2f}x "
                  f"(median of paired rounds {v['paired']:.2f}x)")
        return
    hosts = 1000
    ticks, per_tick, n_place = (30, 25, 500) if a.quick else (100, 40, 2000)
    k = 64
    print(f"cluster: {hosts} hosts x 8 GPUs, leaf/spine, 4 regions")
    f = bench_refresh(hosts, 20 if a.quick else 100)
    print(f"refresh per tick: p50 {f['p50']:.1f} ms  p99 {f['p99']:.1f} ms  max {f['max']:.1f} ms  (floor 50 ms; published 192 ms)")
    print(f"  naive networkx attribute refresh: {f['naive']:.1f} ms  -> ratio naive/ours {f['naive'] / f['p50']:.1f}x")
    print(f"  threaded at 200 ms for 2 s: {f['threaded_ticks']} ticks, {f['overruns']} overruns")
    p = bench_place(hosts, n_place, k, 2.0 if a.quick else 4.0)
    print(f"placement ({k} candidates, redis dependency, {p['n']} requests, {p['refused']} refused): "
          f"wall p50 {p['p50'] * 1e3:.0f} us  p99 {p['p99'] * 1e3:.0f} us  (floor p99 1 ms)")
    print(f"  thread CPU time per placement: p50 {p['cpu_p50'] * 1e3:.0f} us  p99 {p['cpu_p99'] * 1e3:.0f} us")
    print(f"  baseline, same run: reference per-request evaluation (the pre-table path, no plan built): "
          f"p50 {p['ref_p50'] * 1e3:.0f} us  p99 {p['ref_p99'] * 1e3:.0f} us -> ratio p50 {p['ref_p50'] / p['p50']:.1f}x, "
          f"p99 {p['ref_p99'] / p['p99']:.1f}x")
    print(f"  naive networkx Dijkstra from the ingress, per request: {p['naive']:.1f} ms -> ratio {p['naive'] / p['p50']:.0f}x")
    lv = p["live"]
    print(f"  with the refresher thread at 200 ms alongside ({lv['n']} placements, {lv['ticks']} ticks, refresh p50 "
          f"{lv['refresh_p50']:.1f} ms, {lv['stale']} stale): wall p50 {lv['p50'] * 1e3:.0f} us  p90 {lv['p90'] * 1e3:.0f} us  "
          f"p99 {lv['p99'] * 1e3:.0f} us")
    print(f"    {lv['overlap']:.1%} overlapped a refresh: wall p50 {lv['over_p50'] * 1e3:.0f} us  p90 {lv['over_p90'] * 1e3:.0f} us, "
          f"wait (wall - CPU) p90 {lv['over_wait_p90'] * 1e3:.0f} us; the others: p99 {lv['rest_p99'] * 1e3:.0f} us, "
          f"wait p99 {lv['rest_wait_p99'] * 1e3:.0f} us")
    tk = 8
    tl = bench_tight(hosts, 2000 if a.quick else 5000, tk, 5 if a.quick else 9)
    print(f"tight loop, Placer.place with {tk} candidates (best of alternating rounds, same run): numpy path "
          f"{tl['numpy']:.1f} us, scalar path {tl['scalar']:.1f} us CPU -> ratio {tl['numpy'] / tl['scalar']:.2f}x "
          f"(median of paired rounds {tl['paired']:.2f}x; {tl['refused']:.0%} refused)")
    print(f"  lookup alone: numpy {tl['lookup_numpy']:.1f} us, scalar {tl['lookup_scalar']:.1f} us -> ratio "
          f"{tl['lookup_numpy'] / tl['lookup_scalar']:.2f}x; per-(tick, contract) table with its block: {tl['table_ms']:.2f} ms")
    if a.against:
        ab = bench_against(a.against, hosts, 2000 if a.quick else 4000, 5 if a.quick else 7)
        for kk, v in ab.items():
            print(f"Placer.place, {kk} candidates, against {a.against} (thread CPU, best of paired rounds): before "
                  f"{v['before']:.1f} us, after {v['after']:.1f} us -> ratio {v['before'] / v['after']:.2f}x "
                  f"(median of paired rounds {v['paired']:.2f}x)")
    tail = bench_tail(hosts, ticks, per_tick, k)
    print(f"tail simulation: {ticks} ticks x {per_tick} requests, {k} candidates each, same event script")
    print("  predicted end-to-end latency (the issue's measure: the latency model on the snapshot each placement "
          "saw, every policy's choice alike):")
    for name, d in tail.items():
        pr = d["predicted"]
        print(f"    {name:15s} P99 {pr['p99']:8.1f} ms  P50 {pr['p50']:7.1f} ms  spread of per-tick P99 ±{pr['spread']:.1f} ms"
              f"  over budget {pr['over_budget']:.1%}  refused {d['refused']}")
    ca = tail["contract-aware"]
    base_p = min(tail["round-robin"]["predicted"]["spread"], tail["least-loaded"]["predicted"]["spread"])
    print(f"    spread ratio (best baseline / contract-aware): {base_p / max(ca['predicted']['spread'], 1e-9):.1f}x"
          f"  (reference: ±47 / ±8 ms = 5.9x)")
    print("  realised end-to-end latency (the model on the next tick's true state, collapsed GPUs at their collapsed "
          "rate, plus noise: what no snapshot can foresee counts too):")
    for name, d in tail.items():
        print(f"    {name:15s} P99 {d['p99']:8.1f} ms  P50 {d['p50']:7.1f} ms  spread of per-tick P99 ±{d['spread']:.1f} ms"
              f" (±{d['spread_steady']:.1f} ms without the {d['onset_ticks']} onset ticks)  over budget {d['over_budget']:.1%}")
    for b in ca["breakers"]:
        print(f"    contract-aware + breaker {b['label']} (cancel, redirect with X-Retry-Count: 1): P99 {b['p99']:.1f} ms"
              f"  P50 {b['p50']:.1f} ms  spread ±{b['spread']:.1f} ms (±{b['spread_steady']:.1f} ms without onset ticks)"
              f"  over budget {b['over_budget']:.1%}  retried {b['retries']} ({b['needless']} of them would have met the SLO)")
    base = min(tail["round-robin"]["spread"], tail["least-loaded"]["spread"])
    base_s = min(tail["round-robin"]["spread_steady"], tail["least-loaded"]["spread_steady"])
    print(f"    spread ratio (best baseline / contract-aware): {base / max(ca['spread'], 1e-9):.1f}x;"
          f" without onset ticks: {base_s / max(ca['spread_steady'], 1e-9):.1f}x")
    if a.plot:
        plot(tail, a.plot, ticks)
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
