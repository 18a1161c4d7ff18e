"""Placer benchmark: refresh latency per tick, placement latency, and a tail-latency
simulation of contract-aware placement vs round-robin vs least-loaded under one scripted
congestion event script.

    .venv/bin/python benchmarks/placer.py [--quick] [--plot benchmarks/placer_tail.png]

Baselines measured in the same run: the naive refresh (writing every tick's telemetry into
the networkx graph) and naive placement (networkx Dijkstra over the full graph per request).
"""

from __future__ import annotations

import argparse
import statistics
import time

import networkx as nx
import numpy as np

from policyc.compiler.bundle import (
    Compute, Contract, Dependencies, Interval, Memory, ServiceDependency, Slo, SourceRef,
)
from policyc.matcher.instance import Instance
from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster, Thresholds
from policyc.placer.catalog import DEFAULT_CATALOG, catalog_by_name
from policyc.placer.evaluate import evaluate
from policyc.placer.shares import share_bounds
from policyc.placer.snapshot import build_snapshot

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


def bench_place(hosts: int, n: int, k: int) -> dict[str, float]:
    sim = SimulatedCluster(seed=3, hosts=hosts, gpus_per_host=8)
    now = [0.0]  # simulated time: 100 placements per 200 ms tick, so snapshots are fresh
    r = Refresher(sim, clock=lambda: now[0])
    placer = Placer(r, clock=lambda: now[0])
    c = contract()
    insts = fleet(sim, "us-west")
    rng = np.random.default_rng(0)
    r.tick()
    times = []
    for i in range(n):
        if i % 100 == 99:
            now[0] += 0.2
            r.tick()
        cands = [insts[j] for j in rng.choice(len(insts), k, replace=False)]
        t0 = time.perf_counter()
        placer.place(cands, BUDGET, c, ingress=INGRESS)
        times.append((time.perf_counter() - t0) * 1e3)
    g = r.current().graph()
    for u, v, d in g.edges(data=True):
        d["w"] = d.get("latency", 1e-6) * (1 + 10 * d.get("watermark", 0.0))
    naive = []
    for _ in range(3):
        t0 = time.perf_counter()
        nx.single_source_dijkstra_path_length(g, INGRESS, weight="w")
        naive.append((time.perf_counter() - t0) * 1e3)
    return {"p50": pct(times, 50), "p99": pct(times, 99), "naive": statistics.median(naive), "k": k}


# ----------------------------------------------------------------------------- tail simulation


def script(sim: SimulatedCluster, ticks: int, seed: int) -> list[tuple[int, str]]:
    """The congestion script, identical for every policy (same seed, same targets)."""
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
    for start in range(T(0.05), ticks, max(1, T(0.1))):  # background: random ports flare up
        for p in rng.choice(len(t.ports), max(4, len(t.ports) // 50), replace=False):
            sim.submit(_ev(sim, "watermark", t.port_key(int(p)), float(rng.uniform(0.82, 0.97)), max(1, T(0.05))), at_tick=start)
    return marks


def _ev(sim: SimulatedCluster, kind: str, target: str, value: float, ticks: int):
    from policyc.placer.events import Event, EventKind

    return Event(EventKind(kind), target, value, ticks)


def realized(truth, gpu: int, c: Contract, rng: np.random.Generator, catalog) -> float:
    """What the request experiences: the latency model on the *next* tick's true state
    (no thresholds), a collapsed GPU computing at its collapsed rate, plus noise of the
    predicted spread. Unreachable: the request times out at twice the budget."""
    t = truth.topology
    bounds = share_bounds(c, {t.gpus[gpu].model}, catalog, BUDGET)
    ev = evaluate(truth, PERMISSIVE, np.array([gpu]), bounds, catalog, c, BUDGET,
                  np.array([truth.fabric_rows[t.fabric_index[INGRESS]]]), np.zeros(1))
    total = float(ev.total[0])
    if not np.isfinite(total):
        return 2 * BUDGET
    if truth.gpu_collapsed[gpu]:
        total += float(ev.compute[0]) * (1 / 0.25 - 1)
    return max(0.0, total + float(ev.sigma[0]) * float(rng.standard_normal()))


def bench_tail(hosts: int, ticks: int, per_tick: int, k: int) -> dict[str, dict]:
    catalog = catalog_by_name(DEFAULT_CATALOG)
    out: dict[str, dict] = {}
    for policy in ("contract-aware", "round-robin", "least-loaded"):
        # the contract-aware placer binds the cache to the dedicated proxy the policy asks for;
        # the baselines know nothing of dependencies and call Redis directly (the incident)
        c = contract(proxy="dedicated" if policy == "contract-aware" else "none")
        refused = 0
        sim = SimulatedCluster(seed=42, hosts=hosts, gpus_per_host=8)
        marks = script(sim, ticks, seed=9)
        r = Refresher(sim)
        placer = Placer(r)
        insts = fleet(sim, "us-west")
        t = sim.topology()
        rng = np.random.default_rng(5)
        noise = np.random.default_rng(6)
        rr = 0
        per: list[list[float]] = []
        r.tick()
        for _ in range(ticks):
            snap = r.current()
            chosen: list[int] = []
            for _ in range(per_tick):
                cands = [insts[j] for j in rng.choice(len(insts), k, replace=False)]
                if policy == "contract-aware":
                    plan = placer.place(cands, BUDGET, c, ingress=INGRESS)
                    if not isinstance(plan, PlacementPlan):
                        refused += 1  # refused up front (redirected), not served late
                        continue
                    inst = next(x for x in cands if x.id == plan.instance_id)
                elif policy == "round-robin":
                    inst, rr = cands[rr % k], rr + 1
                else:
                    idx = [t.gpu_index[(x.deployment.host, x.deployment.gpu)] for x in cands]
                    inst = cands[int(np.argmin(snap.gpu_rho[idx]))]
                g = t.gpu_index[(inst.deployment.host, inst.deployment.gpu)]
                chosen.append(g)
                sim.occupy(t.gpu_key(g), 0.05, ticks=3)
            nxt = r.tick()
            truth = build_snapshot(nxt.version, t, nxt.frame, None, None, PERMISSIVE, 0.2, nxt.taken_at)
            per.append([realized(truth, g, c, noise, catalog) * 1e3 for g in chosen])
        p99s = [pct(x, 99) for x in per]
        allv = [v for x in per for v in x]
        out[policy] = {"p99": pct(allv, 99), "p50": pct(allv, 50), "spread": statistics.pstdev(p99s),
                       "series": p99s, "marks": marks, "refused": refused,
                       "over_budget": sum(v > BUDGET * 1e3 for v in allv) / max(1, len(allv))}
    return out


def plot(tail: dict[str, dict], path: str, ticks: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, d in tail.items():
        ax.plot(range(1, ticks + 1), d["series"], label=f"{name}: P99 {d['p99']:.0f} ms, ±{d['spread']:.1f} ms")
    for tick, label in next(iter(tail.values()))["marks"]:
        ax.axvline(tick, color="grey", lw=0.6, ls=":")
        ax.text(tick, ax.get_ylim()[1] * 0.97, label, rotation=90, fontsize=7, va="top")
    ax.set_xlabel("tick (200 ms)")
    ax.set_ylabel("per-tick P99 of end-to-end latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("Placement under scripted congestion (same event script for each policy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller tail simulation and fewer samples")
    ap.add_argument("--plot", default="", help="write the tail-latency plot to this PNG")
    a = ap.parse_args()
    hosts = 1000
    ticks, per_tick, n_place = (30, 25, 500) if a.quick else (100, 40, 2000)
    k = 64
    print(f"cluster: {hosts} hosts x 8 GPUs, leaf/spine, 4 regions")
    f = bench_refresh(hosts, 20 if a.quick else 100)
    print(f"refresh per tick: p50 {f['p50']:.1f} ms  p99 {f['p99']:.1f} ms  max {f['max']:.1f} ms  (floor 50 ms; published 192 ms)")
    print(f"  naive networkx attribute refresh: {f['naive']:.1f} ms  -> ratio naive/ours {f['naive'] / f['p50']:.1f}x")
    print(f"  threaded at 200 ms for 2 s: {f['threaded_ticks']} ticks, {f['overruns']} overruns")
    p = bench_place(hosts, n_place, k)
    print(f"placement ({k} candidates, redis dependency): p50 {p['p50'] * 1e3:.0f} us  p99 {p['p99'] * 1e3:.0f} us  (floor p99 1 ms)")
    print(f"  naive networkx Dijkstra from the ingress, per request: {p['naive']:.1f} ms -> ratio {p['naive'] / p['p50']:.0f}x")
    tail = bench_tail(hosts, ticks, per_tick, k)
    print(f"tail simulation: {ticks} ticks x {per_tick} requests, {k} candidates each, same event script")
    for name, d in tail.items():
        print(f"  {name:15s} P99 {d['p99']:8.1f} ms  P50 {d['p50']:7.1f} ms  spread of per-tick P99 ±{d['spread']:.1f} ms"
              f"  over budget {d['over_budget']:.1%}  refused {d['refused']}")
    base = min(tail["round-robin"]["spread"], tail["least-loaded"]["spread"])
    print(f"  spread ratio (best baseline / contract-aware): {base / max(tail['contract-aware']['spread'], 1e-9):.1f}x")
    if a.plot:
        plot(tail, a.plot, ticks)
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
