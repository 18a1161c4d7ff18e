"""Decision service benchmark: closed-loop grpc.aio clients on loopback against `Decide`
with N registered instances, and a no-op gRPC service answering the same request with a
pre-built response of the same size, measured in the same run.

    .venv/bin/python benchmarks/serve.py [--quick] [--instances 100000] [--seconds 5] [--rounds 3]
                                         [--thread-pool N]
    POLICYC_EVENT_LOOP=asyncio .venv/bin/python benchmarks/serve.py ...   # both servers on asyncio's loop

Reports decisions/s, p50/p99 (client-observed), the ratio to the no-op throughput, and
p99 in an open-loop run paced at 70 % of the measured maximum rate. Decide and no-op
phases alternate (`--rounds`) so that both see the same shared machine. The server runs in a
subprocess-free thread of this process with the audit log and guardian off (they are
asynchronous to the decision path); clients run in a second process so they do not share
the server's GIL. Both servers run on the service's event loop (`server/event_loop.py`:
uvloop unless POLICYC_EVENT_LOOP=asyncio). Also printed: CPU seconds this process (the
server side only: server thread, gRPC's threads, the refresher) spends per call in each
phase, a figure other engineers' load on a shared machine disturbs far less than wall rates.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import time
import warnings

import grpc

from policyc.compiler.pipeline import compile_paths
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.event_loop import loop_kind, new_event_loop
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb

METHOD = "/policyc.decision.v1.Decisions/Decide"
REQUESTS = [
    {"X-SLO-Latency": "150ms", "X-Data-Region": "us-west"},
    {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"},
    {"X-Tenant": "charite", "X-Data-Region": "eu-west"},
    {"X-Tenant": "shopwave", "X-Model": "fraud-scorer-lite", "X-Data-Region": "us-east"},
]


async def _closed(port: int, concurrency: int, seconds: float, rate: float | None) -> tuple[int, list[float]]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(METHOD)
        payloads = [pb.DecideRequest(headers=h).SerializeToString() for h in REQUESTS]
        lat: list[float] = []
        end = time.perf_counter() + seconds
        interval = concurrency / rate if rate else 0.0

        start = time.perf_counter()

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
                lat.append(time.perf_counter() - t)
                k += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return int(len(lat) / (time.perf_counter() - t0)), lat


def _client(port: int, concurrency: int, seconds: float, rate: float | None, q: mp.Queue) -> None:  # type: ignore[type-arg]
    q.put(asyncio.run(_closed(port, concurrency, seconds, rate)))


def load(port: int, concurrency: int, seconds: float, rate: float | None = None) -> tuple[int, float, float, float]:
    """(calls/s, p50 ms, p99 ms, server-process CPU µs per call)."""
    q: mp.Queue = mp.get_context("spawn").Queue()  # type: ignore[type-arg]
    p = mp.get_context("spawn").Process(target=_client, args=(port, concurrency, seconds, rate, q))
    p.start()
    c0 = time.process_time()
    rps, lat = q.get()
    cpu = time.process_time() - c0
    p.join()
    lat.sort()
    return rps, statistics.median(lat) * 1e3, lat[int(0.99 * (len(lat) - 1))] * 1e3, cpu / max(len(lat), 1) * 1e6


class _Noop:
    """A gRPC service with Decide's request and a fixed response of a real decision's size."""

    def __init__(self, response: bytes) -> None:
        self.response = response

    async def start(self) -> int:
        self.server = grpc.aio.server()
        resp = self.response

        async def decide(request: bytes, context) -> bytes:  # type: ignore[no-untyped-def]
            return resp

        handler = grpc.method_handlers_generic_handler("policyc.decision.v1.Decisions", {
            "Decide": grpc.unary_unary_rpc_method_handler(decide)})
        self.server.add_generic_rpc_handlers((handler,))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port


def _in_thread_pool(server: DecisionServer, workers: int) -> None:
    """Variant for comparison: run each decision in a thread pool instead of inline on the
    event loop (what `--thread-pool N` measures)."""
    import concurrent.futures

    from policyc.server import convert
    from policyc.server.errors import ServiceError
    from policyc.server.auth import Permission

    pool = concurrent.futures.ThreadPoolExecutor(workers)
    svc = server.service

    async def decide(request, context):  # type: ignore[no-untyped-def]
        try:
            svc._admit(context, Permission.DECIDE, request.ByteSize())
            d = await asyncio.get_running_loop().run_in_executor(pool, svc.engine.decide, convert.decision_input(request))
        except ServiceError as e:
            await svc._refuse(context, "Decide", e)
            raise
        svc.metrics.observe(d)
        return convert.decision(d)

    svc.Decide = decide  # type: ignore[method-assign]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="20,000 instances, 2 rounds of 3 s per phase")
    ap.add_argument("--instances", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per phase and round")
    ap.add_argument("--rounds", type=int, default=3, help="Decide / no-op phases alternate this many times")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--thread-pool", type=int, default=0, help="run decisions in a pool of N threads (default: inline)")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; event loop {loop_kind().value}")
    n, secs, rounds = (20_000, 3.0, 2) if args.quick else (args.instances, args.seconds, args.rounds)
    warnings.simplefilter("ignore")
    bundle = compile_paths(["policies"], analyse=False).bundle
    assert bundle is not None
    cluster = ClusterSpec(seed=1, hosts=256, gpus_per_host=8, hosts_per_rack=8)
    server = DecisionServer(bundle, ServeConfig(cluster=cluster, enforcer=EnforcerMode.OFF, watch_gpus=False))
    assert server.cluster is not None
    base = admissible_fleet(bundle, server.cluster.gpu_slots())
    replicas = max(1, -(-n // len(base)))
    t = time.perf_counter()
    fleet = admissible_fleet(bundle, server.cluster.gpu_slots(), replicas=replicas)[:n]
    server.engine.register_many(fleet)
    print(f"registered {len(fleet)} instances on {len(server.cluster.gpu_slots())} GPUs in {time.perf_counter() - t:.1f} s")
    if args.thread_pool:
        _in_thread_pool(server, args.thread_pool)
    th = ServerThread(server)
    port = th.start()
    load(port, 4, 1.0)  # warm the feasibility cache and per-contract placer tables
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        response = ch.unary_unary(METHOD)(pb.DecideRequest(headers=REQUESTS[1]).SerializeToString())
    loop = new_event_loop()
    noop = _Noop(response)
    nport = loop.run_until_complete(noop.start())
    import threading

    t2 = threading.Thread(target=loop.run_forever, daemon=True)
    t2.start()
    load(nport, 4, 1.0)
    # Alternate the two services so that both see the same machine (it is shared and its
    # load drifts); the decision server's refresher is paused while the no-op one runs.
    dec: list[tuple[int, float, float, float]] = []
    nop: list[tuple[int, float, float, float]] = []
    for r in range(rounds):
        dec.append(load(port, args.concurrency, secs))
        server.refresher.stop()
        nop.append(load(nport, args.concurrency, secs))
        server.refresher.start()
        print(f"round {r + 1}: Decide {dec[-1][0]}/s (p50 {dec[-1][1]:.2f} ms, p99 {dec[-1][2]:.2f} ms), "
              f"no-op {nop[-1][0]}/s (p50 {nop[-1][1]:.2f} ms, p99 {nop[-1][2]:.2f} ms), ratio {dec[-1][0] / nop[-1][0]:.2f}; "
              f"server CPU per call {dec[-1][3]:.0f} vs {nop[-1][3]:.0f} us; load average {os.getloadavg()[0]:.2f}")
    rps = sum(x[0] for x in dec) / rounds
    nrps = sum(x[0] for x in nop) / rounds
    paced = load(port, args.concurrency, secs, rate=0.7 * rps)
    th.stop()
    asyncio.run_coroutine_threadsafe(noop.server.stop(0), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    mode = f"thread pool of {args.thread_pool}" if args.thread_pool else "inline on the event loop"
    print(f"Decide   {len(fleet)} instances, {args.concurrency} clients, decisions {mode}: {rps:.0f} decisions/s "
          f"(p50 {statistics.median(x[1] for x in dec):.2f} ms, p99 {statistics.median(x[2] for x in dec):.2f} ms, medians of rounds)")
    print(f"no-op    same message sizes ({len(response)} B response): {nrps:.0f} calls/s "
          f"(p50 {statistics.median(x[1] for x in nop):.2f} ms, p99 {statistics.median(x[2] for x in nop):.2f} ms)")
    print(f"ratio    Decide / no-op throughput = {rps / nrps:.2f} (floor 0.6; per round "
          + ", ".join(f"{d[0] / x[0]:.2f}" for d, x in zip(dec, nop)) + ")")
    dcpu, ncpu = statistics.median(x[3] for x in dec), statistics.median(x[3] for x in nop)
    print(f"CPU      server process per call (medians of rounds): Decide {dcpu:.0f} us, no-op {ncpu:.0f} us, "
          f"ratio no-op / Decide = {ncpu / dcpu:.2f} (the throughput ratio a server-bound, otherwise idle machine would show)")
    print(f"paced    at 70 % of max ({0.7 * rps:.0f}/s offered): {paced[0]} decisions/s, p50 {paced[1]:.2f} ms, "
          f"p99 {paced[2]:.2f} ms (target ≤ 5 ms); load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
