"""Decision service benchmark: closed-loop grpc.aio clients on loopback against `Decide`
with N registered instances, and a no-op gRPC service answering the same request with a
pre-built response of the same size, measured in the same run.

    .venv/bin/python benchmarks/serve.py [--quick] [--instances 100000] [--seconds 5] [--rounds 5] [--soak 120 [--unsettled]]
    .venv/bin/python benchmarks/serve.py --mix diverse --batch 32 [--no-paced]   # the diverse mix; DecideBatch vs Decide
    POLICYC_EVENT_LOOP=asyncio .venv/bin/python benchmarks/serve.py ...   # both servers on asyncio's loop
    POLICYC_BENCH_CLIENT_LOOP=asyncio .venv/bin/python benchmarks/serve.py ...   # clients on asyncio's loop (passes 1-3)

Reports decisions/s, p50/p99 (client-observed, after each phase's `WARMUP`), the ratio to the no-op throughput, and
p99 in an open-loop run paced at 70 % of the measured maximum rate (with, for reference, the
no-op service paced at the same rate, at 70 % of its own maximum, and at 100 calls/s: the
floor this machine sets for a service that does nothing). Decide and no-op
phases alternate (`--rounds`) so that both see the same shared machine. Then the calibration:
the no-op whose handler burns as much loop-thread CPU per call as Decide adds, and a third and
two thirds of that, each against the plain no-op (and, paced, at Decide's rate): what a
handler of Decide's CPU cost reads here whatever its work is, and how much handler CPU the
0.8 floor admits on this machine. The server runs in a
subprocess-free thread of this process with the audit log and guardian off (they are
asynchronous to the decision path); clients run in a second process so they do not share
the server's GIL. Before the rounds the whole request mix is sent once (`warm_mix`), so the
rounds measure a warm solver cache (what the warm-up solved is printed). Both servers run on the service's event loop (`server/event_loop.py`:
uvloop unless POLICYC_EVENT_LOOP=asyncio). Also printed: CPU seconds this process (the
server side only: server thread, gRPC's threads, the refresher) spends per call in each
phase (and of it, the event-loop thread's), a figure other engineers' load on a shared
machine disturbs far less than wall rates; and, for the paced run, which server-side events
(the refresher's steps, score pushes among them, and garbage collections; their
perf_counter spans, the clients' clock being the same CLOCK_MONOTONIC) the calls slower
than 5 ms overlapped.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing as mp
import os
import random
import statistics
import threading
import time
import warnings
from array import array
from typing import NamedTuple

import grpc

from policyc.compiler.pipeline import compile_paths
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.event_loop import loop_kind, new_event_loop
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb

METHOD = "/policyc.decision.v1.Decisions/Decide"
BATCH_METHOD = "/policyc.decision.v1.Decisions/DecideBatch"
IDLE_RATE = 100.0  # calls/s: the no-op's reference phase for what a nearly idle service gets here
# seconds of calls at the start of every phase that are made and not measured (h2load's
# --warm-up-time): a new client's first 50 ms against Decide held 36-77 calls over 5 ms,
# 0.5-1 % of a paced 3 s phase and so its p99 alone, where later 50 ms held 0-20
WARMUP = 0.25
REQUESTS = [
    {"X-SLO-Latency": "150ms", "X-Data-Region": "us-west"},
    {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"},
    {"X-Tenant": "charite", "X-Data-Region": "eu-west"},
    {"X-Tenant": "shopwave", "X-Model": "fraud-scorer-lite", "X-Data-Region": "us-east"},
]


def diverse_headers(n: int, seed: int = 25) -> list[dict[str, str]]:
    """The issue's realistic header mix: an SLO drawn from 1-500 ms (to the hundredth), a
    region on 60 % of requests, a tenant on 70 %, a pinned model on 30 %."""
    rng = random.Random(seed)
    regions = ("us-west", "us-east", "eu-west", "eu-central")
    tenants = ("acme-bank", "first-federal", "st-marys", "charite", "shopwave")
    models = ("fraud-scorer", "fraud-scorer-lite", "recommender", "support-chatbot", "clinical-notes")
    out = []
    for _ in range(n):
        h = {"X-SLO-Latency": f"{rng.uniform(1, 500):.2f}ms"}
        if rng.random() < 0.6:
            h["X-Data-Region"] = rng.choice(regions)
        if rng.random() < 0.7:
            h["X-Tenant"] = rng.choice(tenants)
        if rng.random() < 0.3:
            h["X-Model"] = rng.choice(models)
        out.append(h)
    return out


def _payloads(mix: str, batch: int, seed: int) -> list[bytes]:
    headers = REQUESTS if mix == "four" else diverse_headers(20_000, seed)
    reqs = [pb.DecideRequest(headers=h) for h in headers]
    if not batch:
        return [r.SerializeToString() for r in reqs]
    return [pb.DecideBatchRequest(requests=[reqs[(i + j) % len(reqs)] for j in range(batch)]).SerializeToString()
            for i in range(0, max(len(reqs), batch), batch)]


async def _closed(port: int, concurrency: int, seconds: float, rate: float | None, mix: str = "four", batch: int = 0,
                  seed: int = 25) -> tuple[int, list[float], list[float], int]:
    """`seconds` of calls after `WARMUP` seconds of them: (calls/s, latencies and starts of
    the calls started after the warm-up, how many calls were made in all)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(BATCH_METHOD if batch else METHOD)
        payloads = _payloads(mix, batch, seed)
        lat: list[float] = []
        starts: list[float] = []  # perf_counter is CLOCK_MONOTONIC: comparable with the server process's
        interval = concurrency / rate if rate else 0.0
        start = time.perf_counter()
        measured = start + WARMUP
        end = measured + seconds
        made = [0] * concurrency  # calls per worker, the warm-up's too

        async def worker(i: int) -> None:
            k = i
            # Paced workers start spread over one interval: an open-loop arrival stream, not
            # `concurrency` requests landing together every interval (a self-made burst).
            nxt = start + i * interval / concurrency
            while time.perf_counter() < end:
                if interval:
                    nxt += interval
                    delay = nxt - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                t = time.perf_counter()
                await call(payloads[k % len(payloads)])
                if t >= measured:
                    lat.append(time.perf_counter() - t)
                    starts.append(t)
                k += 1
                made[i] += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return int(len(lat) * max(batch, 1) / (time.perf_counter() - measured)), lat, starts, sum(made)


def _client(port: int, concurrency: int, seconds: float, rate: float | None, q: mp.Queue,  # type: ignore[type-arg]
            mix: str = "four", batch: int = 0, seed: int = 25) -> None:
    """The client process, on uvloop unless POLICYC_BENCH_CLIENT_LOOP=asyncio: with asyncio's
    loop the client process costs more CPU per call than the no-op server and, on two vCPUs,
    caps the no-op's rate (measured: no-op 2,286/s with a uvloop client vs ~1,200-1,500/s),
    which flatters the Decide / no-op ratio."""
    if os.environ.get("POLICYC_BENCH_CLIENT_LOOP", "uvloop") == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            q.put(runner.run(_closed(port, concurrency, seconds, rate, mix, batch, seed)))
        return
    q.put(asyncio.run(_closed(port, concurrency, seconds, rate, mix, batch, seed)))


class Phase(NamedTuple):
    rps: int
    p50_ms: float
    p99_ms: float
    cpu_us: float  # server process CPU per call
    loop_cpu_us: float  # of which the server's event-loop thread
    starts: array  # every call's start, perf_counter seconds (arrays: untracked by the collector,
    lats: array  # so the harness adds nothing to what the server's full collections scan)

    @property
    def calls(self) -> list[tuple[float, float]]:
        """(start, latency) of every call."""
        return list(zip(self.starts, self.lats))


def _thread_cpu(native_id: int | None) -> float:
    """CPU seconds of one thread of this process (Linux), 0 where unknown."""
    if native_id is None:
        return 0.0
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            x = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")


MIX = "four"  # the request mix every phase sends (`--mix`)


def load(port: int, concurrency: int, seconds: float, rate: float | None = None, loop_thread: int | None = None,
         batch: int = 0, seed: int = 25) -> Phase:
    """One phase from a client process; `batch`: DecideBatch calls of that many requests
    (rps then counts decisions; latencies are per call)."""
    q: mp.Queue = mp.get_context("spawn").Queue()  # type: ignore[type-arg]
    p = mp.get_context("spawn").Process(target=_client, args=(port, concurrency, seconds, rate, q, MIX, batch, seed))
    p.start()
    c0, l0 = time.process_time(), _thread_cpu(loop_thread)
    rps, lat, starts, made = q.get()
    cpu, lcpu = time.process_time() - c0, _thread_cpu(loop_thread) - l0
    p.join()
    starts, lats = array("d", starts), array("d", lat)
    lat = sorted(lat)
    n = max(made, 1)  # the server's CPU was spent on the warm-up's calls too
    return Phase(rps, statistics.median(lat) * 1e3, lat[int(0.99 * (len(lat) - 1))] * 1e3, cpu / n * 1e6, lcpu / n * 1e6,
                 starts, lats)


class GcSpans:
    """(start, end, generation) of every garbage collection in this process while installed."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, int]] = []
        self._t = 0.0

    def __call__(self, phase: str, info: dict) -> None:  # type: ignore[type-arg]
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.spans.append((self._t, time.perf_counter(), info["generation"]))

    def __enter__(self) -> "GcSpans":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def tail_causes(calls: list[tuple[float, float]], events: dict[str, list[tuple[float, float]]],
                slow: float) -> tuple[dict[str, tuple[int, int]], int, float]:
    """Which server-side events the calls slower than `slow` seconds overlapped: per event
    kind, (slow calls overlapping one, all calls overlapping one) — an event that makes the
    tail is over-represented among the slow calls; the slow calls that overlapped none; and
    the p99 (ms) of the calls that overlapped no event at all."""
    lo = min((t for t, _ in calls), default=0.0)
    hi = max((t + lat for t, lat in calls), default=0.0)
    events = {k: [(a, b) for a, b in spans if b > lo and a < hi] for k, spans in events.items()}
    counts = {k: [0, 0] for k in events}
    unexplained = 0
    quiet: list[float] = []
    for t, lat in calls:
        hit = [k for k, spans in events.items() if any(a < t + lat and b > t for a, b in spans)]
        if not hit:
            quiet.append(lat)
        for k in hit:
            counts[k][1] += 1
            counts[k][0] += lat > slow
        unexplained += lat > slow and not hit
    quiet.sort()
    return ({k: (v[0], v[1]) for k, v in counts.items()}, unexplained,
            quiet[int(0.99 * (len(quiet) - 1))] * 1e3 if quiet else float("nan"))


def backlogs(calls: list[tuple[float, float]], slow: float) -> list[tuple[float, int]]:
    """The calls slower than `slow` seconds grouped into backlog episodes (slow calls whose
    spans overlap, in start order): (episode length in seconds, its slow calls), longest
    first. A few long episodes of many calls are a queue the server fell behind on and
    drained; many one-call episodes are isolated stalls."""
    episodes: list[list[float]] = []
    for t, lat in sorted(c for c in calls if c[1] > slow):
        if episodes and t <= episodes[-1][1]:
            e = episodes[-1]
            e[1], e[2] = max(e[1], t + lat), e[2] + 1
        else:
            episodes.append([t, t + lat, 1])
    return sorted(((b - a, int(n)) for a, b, n in episodes), reverse=True)


HOLD = 3e-4  # seconds: a loop callback longer than this makes a paced call wait noticeably


def loop_holds(holds: list[tuple[str, float]]) -> str:
    """What held the serving loop in some phases, per kind (refresher steps, collections by
    generation; a collection holds whichever thread runs it, and the loop with it): how
    many, how many over `HOLD`, the median, the longest and their total."""
    by: dict[str, list[float]] = {}
    for kind, d in holds:
        by.setdefault(kind, []).append(d)
    return "; ".join(f"{k} {len(ds)} ({sum(d > HOLD for d in ds)} over {HOLD * 1e3:g} ms), median "
                     f"{statistics.median(ds) * 1e3:.2f} ms, longest {max(ds) * 1e3:.2f} ms, total {sum(ds) * 1e3:.0f} ms"
                     for k, ds in sorted(by.items())) or "none"


class _Noop:
    """A gRPC service with Decide's request and a fixed response of a real decision's size.

    `spin`: seconds of this thread's CPU each call burns before answering (0: none), the
    calibration's handlers: one that costs the serving loop what Decide costs it more than
    the no-op, and others between, show what throughput and tail a handler of that CPU cost
    gets on this machine, whatever its work is."""

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.spin = 0.0

    async def start(self) -> int:
        self.server = grpc.aio.server()
        resp = self.response
        clock = time.thread_time

        async def decide(request: bytes, context) -> bytes:  # type: ignore[no-untyped-def]
            if self.spin:
                end = clock() + self.spin
                while clock() < end:
                    pass
            return resp

        handler = grpc.method_handlers_generic_handler("policyc.decision.v1.Decisions", {
            "Decide": grpc.unary_unary_rpc_method_handler(decide)})
        self.server.add_generic_rpc_handlers((handler,))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port


def build_server(instances: int, settle_heap: bool = True) -> DecisionServer:
    """The benchmarks' decision service: the example policies, a simulated 256-host x 8-GPU
    cluster, `instances` registered instances (the admissible fleet, replicated), no enforcer;
    the heap settled as `policyc serve` does unless `settle_heap` is False."""
    bundle = compile_paths(["policies"], analyse=False).bundle
    assert bundle is not None
    cluster = ClusterSpec(seed=1, hosts=256, gpus_per_host=8, hosts_per_rack=8)
    server = DecisionServer(bundle, ServeConfig(cluster=cluster, enforcer=EnforcerMode.OFF, watch_gpus=False,
                                                  settle_heap=settle_heap))
    assert server.cluster is not None
    base = admissible_fleet(bundle, server.cluster.gpu_slots())
    fleet = admissible_fleet(bundle, server.cluster.gpu_slots(), replicas=max(1, -(-instances // len(base))))[:instances]
    server.engine.register_many(fleet)
    return server


def warm_mix(server: DecisionServer, port: int, mix: str) -> str:
    """Send every request of the mix once (DecideBatch calls of 64) before measuring: the
    steady state a serving process reaches is a solver cache holding every reduced
    feasibility shape of its traffic (a finite, small set), so the rounds measure that,
    not the first sight of each shape (which the solver thread answers in milliseconds,
    off the loop). Sent last to first, so that the request-shape cache ends up holding the
    mix's first requests, the ones every round starts with (as each round after the first
    finds them from the round before). What the warm-up cost is printed."""
    feas = server.engine.state.feasibility
    before, t = feas.solves_background, time.perf_counter()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(BATCH_METHOD)
        payloads = _payloads(mix, 64, 25)
        for raw in reversed(payloads):
            call(raw, timeout=120)
    return (f"warm     the whole {mix} mix once ({len(payloads)} DecideBatch calls of 64) in {time.perf_counter() - t:.1f} s: "
            f"{feas.solves_background - before} reduced feasibility shapes solved in the solver thread")


def ranking(server: DecisionServer) -> None:
    """What a re-rank of each request shape costs (the engine re-ranks a shape after a
    registration or removal, and at most once a refresher tick for score pushes), and how many
    distinct GPUs the placer gets to choose among, plain best-k against distinct (model, GPU)."""
    from policyc.server.decision import DecisionInput

    reg, eng = server.engine.state.registry, server.engine
    for h in REQUESTS:
        q = eng.prepare(DecisionInput(h, {})).request
        out = []
        for distinct in (False, True):
            t = time.perf_counter()
            for _ in range(20):
                m = reg.match(q, 32, distinct_gpus=distinct)
            us = (time.perf_counter() - t) / 20 * 1e6
            gpus = len({(x.instance.model, x.instance.deployment.host, x.instance.deployment.gpu) for x in m.best})
            out.append(f"{'distinct' if distinct else 'plain'} {us:.0f} us, {gpus} (model, GPU) pair(s) among the best {len(m.best)}")
        print(f"ranking  {', '.join(f'{k}={v}' for k, v in h.items())}: {m.count} matching; " + "; ".join(out))


def freshness(server: DecisionServer) -> str:
    """How far the matcher's ranking trails the placer: |matcher score - current snapshot
    score| over the (model, GPU) groups (what the score pusher's budget per tick trades
    against the serving loop's time)."""
    snap = server.refresher.current()
    seen: dict[tuple[str, str, str], float] = {}
    for inst, _, score in server.engine.state.registry.entries():
        d = inst.deployment
        seen[(inst.model, d.host, d.gpu)] = abs(score - snap.gpu_score(d.host, d.gpu))
    gaps = sorted(seen.values())
    if not gaps:
        return "no groups"
    p99 = gaps[int(0.99 * (len(gaps) - 1))]
    return (f"{len(gaps)} (model, GPU) groups: median {statistics.median(gaps):.3f}, p99 {p99:.3f}, "
            f"{sum(g >= 0.05 for g in gaps) / len(gaps):.1%} off by 0.05 or more (push budget "
            f"{server.scores.budget} group moves per tick)")


def soak(server: DecisionServer, port: int, concurrency: int, seconds: float, rate: float, loop_thread: int | None) -> str:
    """One long paced run: the tail a full garbage collection makes (a pause of the whole
    process, every call in flight waiting it out) shows only in runs longer than the
    collector's period (minutes at this rate without `ServeConfig.settle_heap`). No collection
    is forced first: the collector runs on its own schedule, as in a serving process."""
    settled = len(server.heap.passes) if server.heap is not None else 0
    with GcSpans() as gcs:
        ph = load(port, concurrency, seconds, rate=rate, loop_thread=loop_thread)
    lat = sorted(ph.lats)
    full = [b - a for a, b, g in gcs.spans if g == 2]
    passes = list(server.heap.passes)[settled:] if server.heap is not None else []
    return (f"soak     {seconds:.0f} s paced at {rate:.0f}/s (settle_heap {server.heap is not None}): {ph.rps} decisions/s, "
            f"p50 {ph.p50_ms:.2f} ms, p99 {ph.p99_ms:.2f} ms, p99.9 {lat[int(0.999 * (len(lat) - 1))] * 1e3:.2f} ms, "
            f"slowest {lat[-1] * 1e3:.1f} ms; full collections {len(full)}"
            + (f" (longest {max(full) * 1e3:.0f} ms)" if full else "")
            + f", settling passes {len(passes)}" + (f" (longest {max(passes) * 1e3:.0f} ms)" if passes else ""))


def calibrate(noop: _Noop, nport: int, nloop: int | None, dec: list[Phase], nop: list[Phase], concurrency: int,
              secs: float, rounds: int) -> float:
    """What a handler's CPU alone costs here: the no-op burning `spin` of loop-thread CPU per
    call (Decide's extra over the no-op as these rounds measured it, and fractions of it),
    rounds alternating with the plain no-op. Prints each one's throughput ratio to the plain
    no-op beside Decide's, and the spin at which the ratio crosses the 0.8 floor (linear
    between the two measured points around it). Returns Decide's extra loop CPU (seconds)."""
    med = statistics.median
    extra = max(0.0, med(d.loop_cpu_us for d in dec) - med(x.loop_cpu_us for x in nop)) * 1e-6
    spins = (0.0, extra / 3, 2 * extra / 3, extra)
    got: dict[float, list[float]] = {s: [] for s in spins[1:]}
    for r in range(rounds):
        for s in (spins[1:] if r % 2 == 0 else spins[:0:-1]):  # each spin after a plain round; the spins up, then down
            noop.spin = 0.0
            plain = load(nport, concurrency, secs, loop_thread=nloop)
            noop.spin = s
            spun = load(nport, concurrency, secs, loop_thread=nloop)
            got[s].append(spun.rps / plain.rps)
            print(f"calibration round {r + 1}: no-op burning {s * 1e6:.0f} us of loop CPU per call {spun.rps}/s "
                  f"(loop thread {spun.loop_cpu_us:.0f} us per call), plain no-op {plain.rps}/s, ratio {spun.rps / plain.rps:.2f}")
    noop.spin = 0.0
    ratios = [1.0] + [med(got[s]) for s in spins[1:]]
    cross = next((spins[i] + (spins[i + 1] - spins[i]) * (ratios[i] - 0.8) / (ratios[i] - ratios[i + 1])
                  for i in range(len(spins) - 1) if ratios[i] >= 0.8 > ratios[i + 1] and ratios[i] > ratios[i + 1]), None)
    d_ratio = med(d.rps / x.rps for d, x in zip(dec, nop))
    print(f"calib    a no-op whose handler burns the loop CPU Decide adds ({extra * 1e6:.0f} us a call) reads "
          f"{ratios[-1]:.2f} of the plain no-op (Decide {d_ratio:.2f}); burning {spins[1] * 1e6:.0f} / {spins[2] * 1e6:.0f} us: "
          f"{ratios[1]:.2f} / {ratios[2]:.2f} (medians of {rounds} rounds); the 0.8 floor admits "
          + (f"about {cross * 1e6:.0f} us of handler CPU per call here" if cross is not None else
             ("more than Decide adds" if ratios[-1] >= 0.8 else f"less than {spins[1] * 1e6:.0f} us of handler CPU per call here")))
    return extra


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="20,000 instances, 2 rounds of 3 s per phase")
    ap.add_argument("--instances", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per phase and round")
    ap.add_argument("--rounds", type=int, default=5,
                    help="Decide / no-op phases alternate this many times (single rounds move by ±0.06 here)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                    help="then one long paced run of Decide at 70 %% of max: p99, p99.9, the slowest call and the "
                         "collector's full passes (what short rounds rarely catch)")
    ap.add_argument("--unsettled", action="store_true", help="serve without ServeConfig.settle_heap, for comparison")
    ap.add_argument("--mix", choices=("four", "diverse"), default="four",
                    help="four repeated request shapes, or the diverse mix (random SLOs 1-500 ms, region 60 %%, "
                         "tenant 70 %%, pinned model 30 %%; 20,000 requests, mostly new shapes)")
    ap.add_argument("--batch", type=int, default=0, metavar="N",
                    help="also alternate unary Decide with DecideBatch calls of N requests (decisions/s compared)")
    ap.add_argument("--no-paced", action="store_true", help="stop after the closed-loop (and batch) rounds")
    args = ap.parse_args()
    global MIX
    MIX = args.mix
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; event loop {loop_kind().value}, "
          f"clients on {os.environ.get('POLICYC_BENCH_CLIENT_LOOP', 'uvloop')}")
    n, secs, rounds = (20_000, 3.0, 2) if args.quick else (args.instances, args.seconds, args.rounds)
    warnings.simplefilter("ignore")
    t = time.perf_counter()
    server = build_server(n, settle_heap=not args.unsettled)
    assert server.cluster is not None
    print(f"compiled and registered {n} instances on {len(server.cluster.gpu_slots())} GPUs in {time.perf_counter() - t:.1f} s")
    ranking(server)
    th = ServerThread(server)
    port = th.start()
    load(port, 4, 1.0)  # warm the per-contract placer tables
    print(warm_mix(server, port, args.mix))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        response = ch.unary_unary(METHOD)(pb.DecideRequest(headers=REQUESTS[1]).SerializeToString())
    loop = new_event_loop()
    noop = _Noop(response)
    nport = loop.run_until_complete(noop.start())
    t2 = threading.Thread(target=loop.run_forever, daemon=True)
    t2.start()
    load(nport, 4, 1.0)
    # Alternate the two services so that both see the same machine (it is shared and its
    # load drifts); the decision server's refresher is paused while the no-op one runs.
    dloop, nloop = th.native_id, t2.native_id
    dec: list[Phase] = []
    nop: list[Phase] = []
    for r in range(rounds):
        dec.append(load(port, args.concurrency, secs, loop_thread=dloop))
        server.refresher.stop()
        nop.append(load(nport, args.concurrency, secs, loop_thread=nloop))
        server.start_refresher()
        d, x = dec[-1], nop[-1]
        print(f"round {r + 1}: Decide {d.rps}/s (p50 {d.p50_ms:.2f} ms, p99 {d.p99_ms:.2f} ms), "
              f"no-op {x.rps}/s (p50 {x.p50_ms:.2f} ms, p99 {x.p99_ms:.2f} ms), ratio {d.rps / x.rps:.2f}; "
              f"server CPU per call {d.cpu_us:.0f} vs {x.cpu_us:.0f} us (loop thread {d.loop_cpu_us:.0f} vs {x.loop_cpu_us:.0f}); "
              f"load average {os.getloadavg()[0]:.2f}")
    rps = sum(x.rps for x in dec) / rounds
    nrps = sum(x.rps for x in nop) / rounds
    server.refresher.stop()
    extra = calibrate(noop, nport, nloop, dec, nop, args.concurrency, secs, rounds)
    server.start_refresher()
    if args.batch:
        one: list[Phase] = []
        many: list[Phase] = []
        for r in range(rounds):  # unary and batched alternate, each on a fresh part of the mix
            one.append(load(port, args.concurrency, secs, loop_thread=dloop, seed=1000 + r))
            many.append(load(port, args.concurrency, secs, loop_thread=dloop, batch=args.batch, seed=2000 + r))
            print(f"batch round {r + 1}: Decide {one[-1].rps}/s, DecideBatch of {args.batch} {many[-1].rps} decisions/s "
                  f"(call p50 {many[-1].p50_ms:.2f} ms, p99 {many[-1].p99_ms:.2f} ms), ratio {many[-1].rps / one[-1].rps:.2f}; "
                  f"server CPU per decision {one[-1].cpu_us:.0f} vs {many[-1].cpu_us / args.batch:.0f} us; "
                  f"load average {os.getloadavg()[0]:.2f}")
        med_ = statistics.median
        print(f"batch    DecideBatch of {args.batch} / unary Decide decisions/s = "
              f"{med_(b.rps for b in many) / med_(u.rps for u in one):.2f} (floor 3; medians of {rounds} rounds; "
              f"{args.concurrency} clients each); per round " + ", ".join(f"{b.rps / u.rps:.2f}" for u, b in zip(one, many)))
    solves = server.service.feasibility_series.counts()
    print(f"solver   Z3 calls on the serving loop {solves['loop']}, in worker threads {solves['inline']}, in the solver "
          f"thread {solves['background']}; {solves['pending']} look-ups found their shape unsolved; "
          f"{len(server.engine.state.feasibility.seen())} feasibility shapes, {len(server.service.shapes)} raw shapes cached, "
          f"matcher plans {len(server.engine.state.registry.index.plans)} (bases {len(server.engine.state.registry.index.bases)})")
    if args.no_paced:
        th.stop()
        asyncio.run_coroutine_threadsafe(noop.server.stop(0), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        print(f"Decide {rps:.0f}/s, no-op {nrps:.0f}/s, ratio {rps / nrps:.2f} (means of rounds); median of paired rounds "
              f"{statistics.median(d.rps / x.rps for d, x in zip(dec, nop)):.2f}; mix {args.mix}; "
              f"load average {os.getloadavg()[0]:.2f} at the end")
        return 0
    time.sleep(2 * server.refresher.interval)
    fresh = freshness(server)  # after a refresher tick or two: what the ranking trails by while serving
    # Paced: rounds alternate the served configuration (the refresher's steps paced on the
    # serving loop), the refresher on its own thread (`refresh_on_loop=False`), the no-op
    # service at the same offered rate (the tail gRPC alone shows here), the no-op at 70 %
    # of its own maximum (what this machine gives a service that does nothing at the load
    # the floor names: the reference for the ≤ 5 ms target) and the no-op at 100 calls/s
    # (the machine's floor: the latency of a call to a nearly idle service, which on a
    # virtual machine includes waking its idle vCPUs); each phase's slow calls are matched
    # against the server-side events they overlapped.
    noop_name = "no-op service, same rate"
    spun_name = f"no-op burning Decide's extra loop CPU ({extra * 1e6:.0f} us a call), same rate"
    own_name = "no-op service at 70 % of its own maximum"
    idle_name = f"no-op service at {IDLE_RATE:g} calls/s"
    # name: (where the refresher runs, None for the no-op phases; offered rate)
    variants = {"served": (th.loop, 0.7 * rps), "refresher on its own thread": (None, 0.7 * rps),
                noop_name: (None, 0.7 * rps), spun_name: (None, 0.7 * rps), own_name: (None, 0.7 * nrps),
                idle_name: (None, IDLE_RATE)}
    paced: dict[str, list[Phase]] = {k: [] for k in variants}
    tails: dict[str, list[tuple[dict[str, tuple[int, int]], int, int, int, float]]] = {k: [] for k in variants}
    slow = 5e-3
    work: list[float] = []
    steps: list[float] = []
    holds: dict[str, list[tuple[str, float]]] = {k: [] for k in variants}  # what held the serving loop, per phase kind
    step_kinds: dict[str, list[tuple[str, float]]] = {k: [] for k in variants}  # refresher steps' CPU by what they did
    for r in range(min(rounds, 2)):  # two rounds of six paced phases keep a full run under three minutes
        for name, (where, rate) in variants.items():
            noop_phase = name in (noop_name, spun_name, own_name, idle_name)
            noop.spin = extra if name == spun_name else 0.0
            if noop_phase:
                server.refresher.stop()
            else:
                server.refresher.start(where)
            gc.collect()
            done, t0 = len(server.refresher.latencies()), time.perf_counter()
            with GcSpans() as gcs:
                ph = load(nport, args.concurrency, secs, rate=rate, loop_thread=nloop) if noop_phase else \
                    load(port, args.concurrency, secs, rate=rate, loop_thread=dloop)
            events = {"refresh step": list(server.refresher.spans()),
                      "GC gen 0-1": [(a, b) for a, b, g in gcs.spans if g < 2], "GC gen 2": [(a, b) for a, b, g in gcs.spans if g == 2]}
            calls = ph.calls
            counts, unexplained, quiet_p99 = tail_causes(calls, events, slow)
            eps = backlogs(calls, slow)
            paced[name].append(ph)
            if name == "served":  # the refreshes of this phase (the history holds 1,000)
                work.extend(server.refresher.latencies()[done:])
                steps.extend(b - a for a, b in server.refresher.spans() if a >= t0)
            tails[name].append((counts, unexplained, sum(lat > slow for lat in ph.lats), len(calls), quiet_p99))
            holds[name].extend((f"GC gen {g}", b - a) for a, b, g in gcs.spans)
            if not noop_phase:  # a step's wall span includes the time other processes had the CPU; its CPU does not
                mine = [s for s in server.refresher.step_records() if s.start >= t0]
                holds[name].extend(("refresher step, CPU", s.cpu) for s in mine)
                holds[name].extend(("refresher step, wall", s.end - s.start) for s in mine)
                step_kinds[name].extend((s.kind, s.cpu) for s in mine)
            n_slow, n_all = tails[name][-1][2], len(calls)
            del calls
            print(f"paced round {r + 1}, {name}: {ph.rps}/s of {rate:.0f} offered, p50 {ph.p50_ms:.2f} ms, p99 {ph.p99_ms:.2f} ms, "
                  f"server CPU per call {ph.cpu_us:.0f} us; {n_slow} of {n_all} calls over {slow * 1e3:g} ms, overlapping "
                  + ", ".join(f"{k} {a} ({a / max(n_slow, 1):.0%} of slow calls, {b / max(n_all, 1):.0%} of all)"
                              for k, (a, b) in counts.items())
                  + f", none of these {unexplained}; "
                  + (f"{len(eps)} backlog episode(s), the longest {eps[0][0] * 1e3:.0f} ms with {eps[0][1]} slow calls"
                     f" ({sum(n for _, n in eps[:3]) / max(n_slow, 1):.0%} of them in the three longest); " if eps else "")
                  + f"load average {os.getloadavg()[0]:.2f}")
    server.start_refresher()
    soaked = soak(server, port, args.concurrency, args.soak, 0.7 * rps, dloop) if args.soak > 0 else None
    th.stop()
    asyncio.run_coroutine_threadsafe(noop.server.stop(0), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    print(f"Decide   {n} instances, {args.concurrency} clients, decisions inline on the event loop: {rps:.0f} decisions/s "
          f"(p50 {med(x.p50_ms for x in dec):.2f} ms, p99 {med(x.p99_ms for x in dec):.2f} ms, medians of rounds); "
          f"{len(server.service.shapes)} request shapes cached")
    print(f"no-op    same message sizes ({len(response)} B response): {nrps:.0f} calls/s "
          f"(p50 {med(x.p50_ms for x in nop):.2f} ms, p99 {med(x.p99_ms for x in nop):.2f} ms)")
    per_round = [d.rps / x.rps for d, x in zip(dec, nop)]
    print(f"ratio    Decide / no-op throughput = {rps / nrps:.2f} (floor 0.8, issue 25; median of the paired rounds "
          f"{med(per_round):.2f}; per round " + ", ".join(f"{r:.2f}" for r in per_round) + ")")
    dcpu, ncpu = med(x.cpu_us for x in dec), med(x.cpu_us for x in nop)
    print(f"CPU      server process per call (medians of rounds): Decide {dcpu:.0f} us (loop thread {med(x.loop_cpu_us for x in dec):.0f}), "
          f"no-op {ncpu:.0f} us (loop thread {med(x.loop_cpu_us for x in nop):.0f}), ratio no-op / Decide = {ncpu / dcpu:.2f} "
          "(the throughput ratio a server-bound, otherwise idle machine would show)")
    for name, (_, rate) in variants.items():
        ps = paced[name]
        print(f"paced    {name}: {rate:.0f}/s offered: {med(x.rps for x in ps):.0f} decisions/s, "
              f"p50 {med(x.p50_ms for x in ps):.2f} ms, p99 {med(x.p99_ms for x in ps):.2f} ms (medians of rounds; target ≤ 5 ms), "
              f"server CPU per call {med(x.cpu_us for x in ps):.0f} us (the server process uses "
              f"{med(x.cpu_us * x.rps for x in ps) / 1e6:.0%} of one CPU at this rate); "
              f"calls over {slow * 1e3:g} ms {sum(t[2] for t in tails[name])} of {sum(t[3] for t in tails[name])}, "
              f"p99 of calls overlapping no server event {med(t[4] for t in tails[name]):.2f} ms")
    served_p99, same_p99 = med(x.p99_ms for x in paced["served"]), med(x.p99_ms for x in paced[noop_name])
    spun_p99 = med(x.p99_ms for x in paced[spun_name])
    print(f"tail     paced p99, Decide served / no-op at the same rate = {served_p99 / same_p99:.1f}x (floor 1.5x, issue 25; "
          f"{served_p99:.2f} vs {same_p99:.2f} ms, medians of rounds); the no-op burning Decide's extra loop CPU at that "
          f"rate {spun_p99:.2f} ms ({served_p99 / spun_p99:.1f}x of it)")
    for name in variants:
        print(f"holds    {name}: " + loop_holds(holds[name]))
    for name in variants:
        if step_kinds[name]:
            print(f"steps    {name}, refresher steps' CPU by kind: " + loop_holds(step_kinds[name]))
    if server.heap is not None:
        print(f"heap     settling passes {len(server.heap.passes)}, full collections whose survivors were frozen "
              f"{server.heap.refrozen}, young ones {server.heap.young_refrozen}; "
              f"{gc.get_freeze_count()} objects frozen")
    print(f"ranking  matcher score against the placer's, after the closed-loop rounds: {fresh}")
    print(f"refresh  served, paced: work per tick (its steps, score pushes included) median {statistics.median(work) * 1e3:.1f} ms, "
          f"max {max(work) * 1e3:.1f} ms over {len(work)} refreshes; steps median {statistics.median(steps) * 1e3:.2f} ms, "
          f"longest {max(steps) * 1e3:.2f} ms")
    if soaked is not None:
        print(soaked)
    outcomes = server.metrics.decisions.totals()
    decided = sum(outcomes.values())
    print("outcomes all phases: " + ", ".join(f"{o} ({r}) {n} ({n / max(decided, 1):.1%})"
                                              for (o, r), n in sorted(outcomes.items(), key=lambda x: -x[1])))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
