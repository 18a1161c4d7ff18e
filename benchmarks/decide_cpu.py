"""Decide's own CPU per call, in process: `DecisionService.decide_bytes` on the serving loop.

    flock /tmp/policyc-bench.lock .venv/bin/python benchmarks/decide_cpu.py [--instances 20000] [--rate 1200] [--seconds 6]
    ... --profile out.prof   # cProfile of the measured calls (the serving thread only)

The closed-loop serve benchmark (`serve.py --mix diverse`) measures Decide against a no-op
gRPC service; the difference is Decide's own work, and it is a small part of what each
call costs there (gRPC's stack is the rest), so its rounds move with the machine's load
far more than that work does. This runs the same server (the same fleet, the refresher
ticking on the serving loop, score pushes, the diverse header mix in the order the
closed-loop clients send it: client i's j-th call sends request i + j, the clients taking
turns, so each request shape comes 16 times within a fraction of a second and then not
again in the round) without gRPC: a coroutine on the server's loop calls
`decide_bytes` on the request bytes, paced at `--rate` calls a second (how many calls fall
within one refresher tick decides how far the per-tick memos are spread), and reads the
serving thread's CPU clock around each call. Printed: thread CPU per call (mean, median,
p90, p99), the serving loop's CPU per call in all (the refresher's steps on the loop
included), and the outcomes.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import _payloads, build_server  # noqa: E402

from policyc.server.app import ServerThread  # noqa: E402

CLIENTS = 16  # the serve benchmark's closed-loop clients (`--concurrency`)


class _Context:
    """What `decide_bytes` reads of a gRPC context on a call that succeeds."""

    def time_remaining(self) -> float | None:
        return None

    def code(self) -> None:
        return None


async def _measure(service, payloads: list[bytes], seconds: float, rate: float,  # type: ignore[no-untyped-def]
                   prof: cProfile.Profile | None) -> tuple[list[float], float, int]:
    ctx = _Context()
    clock = time.thread_time
    per_call: list[float] = []
    interval = 1.0 / rate
    start = time.perf_counter()
    nxt, end, k = start, start + seconds, 0
    loop0 = clock()
    while time.perf_counter() < end:
        nxt += interval
        delay = nxt - time.perf_counter()
        await asyncio.sleep(delay if delay > 0 else 0)  # the loop runs the refresher's steps meanwhile
        raw = payloads[(k % CLIENTS + k // CLIENTS) % len(payloads)]  # client k % 16's (k // 16)-th call
        if prof is not None:
            prof.enable()
        c = clock()
        await service.decide_bytes(raw, ctx)
        per_call.append(clock() - c)
        if prof is not None:
            prof.disable()
        k += 1
    return per_call, clock() - loop0, k


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=1200.0, help="calls per second on the serving loop")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", metavar="FILE", help="write a cProfile of the measured calls here")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    server = build_server(args.instances)
    th = ServerThread(server)
    th.start()
    svc = server.service
    ctx = _Context()
    payloads = _payloads("diverse", 0, 25)

    async def warm() -> None:  # last to first, as `serve.warm_mix`: the cache ends up holding the first ones
        for raw in reversed(payloads[:4096]):
            await svc.decide_bytes(raw, ctx)

    th.call(warm())
    time.sleep(0.5)
    prof = cProfile.Profile() if args.profile else None
    means = []
    for r in range(args.rounds):
        per_call, loop_cpu, n = th.call(_measure(svc, payloads, args.seconds, args.rate, prof), timeout=args.seconds + 60)
        us = sorted(x * 1e6 for x in per_call)
        mean = statistics.fmean(us)
        means.append(mean)
        print(f"round {r + 1}: {n} calls at {args.rate:.0f}/s: decide_bytes thread CPU per call mean {mean:.1f} us, "
              f"median {statistics.median(us):.1f}, p90 {us[int(0.9 * (n - 1))]:.1f}, p99 {us[int(0.99 * (n - 1))]:.1f}; "
              f"serving loop CPU per call in all {loop_cpu / n * 1e6:.1f} us; load average {os.getloadavg()[0]:.2f}")
    print(f"decide_bytes thread CPU per call: mean of rounds {statistics.fmean(means):.1f} us "
          f"(rounds {', '.join(f'{m:.1f}' for m in means)})")
    outcomes = server.metrics.decisions.totals()
    print("outcomes: " + ", ".join(f"{o} ({why}) {n}" for (o, why), n in sorted(outcomes.items(), key=lambda x: -x[1])))
    th.stop()
    if prof is not None:
        prof.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
