"""Decide's own CPU per call, in process: `DecisionService.decide_bytes` on the serving loop.

    flock /tmp/policyc-bench.lock .venv/bin/python benchmarks/decide_cpu.py [--instances 20000] [--rate 1200] [--seconds 6]
    ... --profile out.prof   # cProfile of the measured calls (the serving thread only)
    ... --tight [--per-tick 240]   # no event loop: the refresher ticked by hand, CPU per call and per part
    ... --tight --opcodes   # and Python opcodes executed per call, by function (the same on a loaded machine)

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

`--tight` takes the clocks and the loop out as well, for the steadiest figure there is
here (what changes to Decide's own work are read against): the calls run back to back
on this thread (a call that finds its shape cached awaits nothing, so its coroutine is
driven by hand), the refresher ticks by hand every `--per-tick` calls (1,200 calls a
second over 0.2 s ticks), the placer's clock reads the current snapshot's time (so a
snapshot is never stale), and a shape's ranking is redone after every score push (as a
real tick, at least `score_lag` long, does). Printed per round of ten ticks: CPU per
call (minimum, first quartile and median over the rounds), then what each part took per
call (placement, the matcher's answer and its re-ranks, the response bytes, the counters).
With `--opcodes`, one more round counts the Python bytecode instructions the calls
execute, by function: the workload is deterministic (the simulated cluster, the hand
ticks, the mix), so two versions of the code compare exactly whatever else runs on the
machine (C work, numpy's or protobuf's, is not counted).
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
from collections import Counter
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


def _drive(service, raw: bytes, ctx: _Context) -> bytes:  # type: ignore[no-untyped-def]
    """`decide_bytes` for a cached shape, run to its end on this thread (it awaits nothing)."""
    coro = service.decide_bytes(raw, ctx)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("decide_bytes awaited: the request's shape was not cached")


def tight(server, payloads: list[bytes], per_tick: int, rounds: int,  # type: ignore[no-untyped-def]
          opcodes: bool = False) -> None:
    """The `--tight` mode (see the module's docstring)."""
    eng, svc, ref = server.engine, server.service, server.refresher
    eng.placer._clock = lambda: ref.current().taken_at + 0.01
    eng.score_lag = 0.0
    ctx = _Context()
    cached = payloads[:1200]

    async def warm() -> None:  # last to first: the cache ends up holding the first ones
        for raw in reversed(cached):
            await svc.decide_bytes(raw, ctx)

    asyncio.run(warm())
    parts: dict[str, list[int]] = {}
    patched: list[tuple[object, str]] = []
    clock = time.thread_time_ns

    def timed(obj, name: str, label: str) -> None:  # type: ignore[no-untyped-def]
        f = getattr(obj, name)
        acc = parts.setdefault(label, [0, 0])

        def run(*a, **k):  # type: ignore[no-untyped-def]
            t = clock()
            try:
                return f(*a, **k)
            finally:
                acc[0] += clock() - t
                acc[1] += 1
        setattr(obj, name, run)  # an instance attribute over the method: deleted after the parts round
        patched.append((obj, name))

    def one_round(n: int, trace=None) -> float:  # type: ignore[no-untyped-def]
        total = 0
        for k in range(n):
            if k % per_tick == 0:
                ref.tick()
            raw = cached[(k % CLIENTS + k // CLIENTS) % len(cached)]
            t = clock()
            if trace is not None:
                sys.settrace(trace)
            _drive(svc, raw, ctx)
            if trace is not None:
                sys.settrace(None)
            total += clock() - t
        return total / n / 1e3

    n = 10 * per_tick
    one_round(n)
    got = sorted(one_round(n) for _ in range(rounds))
    print(f"tight    decide_bytes CPU per call over {rounds} rounds of {n} calls ({per_tick} a tick): min {got[0]:.1f} us, "
          f"q25 {got[len(got) // 4]:.1f}, median {statistics.median(got):.1f}; load average {os.getloadavg()[0]:.2f}")
    timed(eng.placer, "place", "placement (Placer.place)")
    timed(eng, "_matched", "the matcher's answer (engine._matched)")
    timed(eng, "_ranked", "  of which re-ranks (engine._ranked)")
    timed(server.metrics.decisions, "observe", "decision counters")
    from policyc.server import request_shapes
    entry_response = request_shapes.ShapeEntry.response
    acc = parts.setdefault("response bytes (ShapeEntry.response)", [0, 0])

    def response(self, d):  # type: ignore[no-untyped-def]
        t = clock()
        try:
            return entry_response(self, d)
        finally:
            acc[0] += clock() - t
            acc[1] += 1
    request_shapes.ShapeEntry.response = response  # type: ignore[method-assign]
    try:
        calls = 3 * n
        whole = statistics.fmean(one_round(n) for _ in range(3))
    finally:
        request_shapes.ShapeEntry.response = entry_response  # type: ignore[method-assign]
        for obj, name in patched:
            delattr(obj, name)
    print(f"parts    (timed, {calls} calls, {whole:.1f} us per call with the timers): "
          + "; ".join(f"{label} {ns / calls / 1e3:.1f} us per call ({k} calls, {ns / max(k, 1) / 1e3:.1f} us each)"
                      for label, (ns, k) in parts.items()))
    if opcodes:
        counts: Counter[tuple[str, str]] = Counter()

        def per_opcode(frame, event, arg):  # type: ignore[no-untyped-def]
            if event == "opcode":
                counts[(frame.f_code.co_filename.rsplit("/", 2)[-2:][-1], frame.f_code.co_name)] += 1
            return per_opcode

        def per_frame(frame, event, arg):  # type: ignore[no-untyped-def]
            frame.f_trace_opcodes = True
            return per_opcode

        one_round(n, per_frame)
        print(f"opcodes  {sum(counts.values()) / n:.0f} Python opcodes per call ({n} calls); by function: "
              + ", ".join(f"{f}:{name} {c / n:.0f}" for (f, name), c in counts.most_common(25)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=1200.0, help="calls per second on the serving loop")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", metavar="FILE", help="write a cProfile of the measured calls here")
    ap.add_argument("--tight", action="store_true", help="no event loop: the refresher ticked by hand (see above)")
    ap.add_argument("--per-tick", type=int, default=240, help="--tight: calls per refresher tick")
    ap.add_argument("--opcodes", action="store_true", help="--tight: count Python opcodes per call too")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    server = build_server(args.instances)
    if args.tight:
        tight(server, _payloads("diverse", 0, 25), args.per_tick, max(args.rounds, 12), args.opcodes)
        return 0
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
