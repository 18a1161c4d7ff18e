"""What each router adds to a streamed answer's time to first token, against the same two
fast model servers, in the same run.

    .venv/bin/python benchmarks/router_ttft.py [--routers policyc,vllm-router:round_robin,envoy-round-robin]
        [--rounds 3] [--requests 15] [--concurrency 1,6] [--max-tokens 64]

`benchmarks/slo_attainment.py` measures attainment with real vLLM or slowed emulators, where a
router's own few milliseconds drown in the servers' queues and a loaded machine's noise. This
script isolates them: two vLLM-compatible emulators (`modelserver/emulator.py`, the H100 timing
model unslowed: a first token in ~6 ms) behind each router (started as `slo_attainment.py`
starts them: policyc's gateway with its picker and stream supervisor, Envoy alone, the Rust
routers from `.venv-routers`), and a client of plain HTTP/1.1 connections, each request a
streamed chat completion (`max_tokens` tokens, so every answer carries as many chunks through
the router), its TTFT timed at the client from the request's send to the first `data:` line.
At each concurrency the routers take turns, round by round (a loaded machine's drift falls on
every router alike), `requests` per client thread per round.

Printed per concurrency and router: TTFT p50 / p90 / mean, and the mean less the best peer's
(policyc's added milliseconds); the emulators' own mean TTFT from their `/metrics`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import slo_attainment as sa  # noqa: E402


def one_stream(url: str, prompt: str, max_tokens: int) -> float | None:
    """One streamed chat completion through `url`: seconds to its first `data:` line (None:
    not a 200 or no event)."""
    host, _, port = url.split("//", 1)[1].rpartition(":")
    body = json.dumps({"model": sa.MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json", "x-slo-ttft-ms": "2000"})
        r = conn.getresponse()
        first = None
        while line := r.readline():
            if first is None and line.startswith(b"data:"):
                first = time.perf_counter() - t0
        return first if r.status == 200 else None
    finally:
        conn.close()


def ready(url: str) -> bool:
    """The router answers a stream (it may not listen yet)."""
    try:
        return one_stream(url, "warm-up", 4) is not None
    except OSError:
        return False


def round_of(url: str, tag: str, concurrency: int, requests: int, max_tokens: int) -> tuple[list[float], int]:
    """`concurrency` client threads, `requests` each, every prompt distinct: the TTFTs and the failures."""
    got: list[float] = []
    failed: list[int] = []  # (list appends are atomic across the client threads; a shared `+=` is not)

    def client(w: int) -> None:
        for i in range(requests):
            t = one_stream(url, f"{tag} client {w} request {i}: tell me a story about the sea", max_tokens)
            if t is None:
                failed.append(i)
            else:
                got.append(t)

    threads = [threading.Thread(target=client, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got, len(failed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routers", default="policyc,vllm-router:round_robin,envoy-round-robin")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=15, help="per client thread per round")
    ap.add_argument("--concurrency", default="1,6", help="client threads, comma-separated levels")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    routers = args.routers.split(",")
    for name in routers:
        why = sa.router_available(name)
        if why is not None:
            raise SystemExit(f"router_ttft: {name}: {why}")
    slots, bundle = sa.pool_slots(2, 1.0)
    pool = sa.Pool(slots, max_seqs=8)
    workdir = Path(tempfile.mkdtemp(prefix="policyc-router-ttft-"))
    started: dict[str, sa.Router] = {}
    try:
        for name in routers:
            started[name] = sa.start_router(name, workdir, bundle, slots, pool.endpoints, 8)
        for name in routers:  # up, and past each one's first connections
            deadline = time.monotonic() + 60
            while not ready(started[name].url):
                if time.monotonic() > deadline:
                    raise SystemExit(f"router_ttft: {name} answered no stream in 60 s")
                time.sleep(0.5)
            for i in range(5):
                one_stream(started[name].url, f"warm-up {i}", 4)
        print(f"router_ttft: 2 emulators, {args.max_tokens} tokens a stream, {args.rounds} rounds, "
              f"{args.requests} requests per client a round; load {os.getloadavg()[0]:.2f}")
        for conc in (int(c) for c in args.concurrency.split(",")):
            ttfts: dict[str, list[float]] = {n: [] for n in routers}
            failed = dict.fromkeys(routers, 0)
            for rd in range(args.rounds):
                for name in routers:
                    got, bad = round_of(started[name].url, f"c{conc} r{rd}", conc, args.requests, args.max_tokens)
                    ttfts[name] += got
                    failed[name] += bad
            means = {n: statistics.mean(xs) for n, xs in ttfts.items() if xs}
            peers = [m for n, m in means.items() if n != "policyc"]
            best = min(peers) if peers else None
            print(f"concurrency {conc}:")
            for name in routers:
                xs = sorted(ttfts[name])
                if not xs:
                    print(f"  {name:28s} no answer ({failed[name]} failed)")
                    continue
                added = f"{1e3 * (means[name] - best):+.2f} ms against the best peer" if best is not None else ""
                print(f"  {name:28s} n={len(xs):4d} failed={failed[name]}  TTFT p50 {1e3 * statistics.median(xs):6.2f}  "
                      f"p90 {1e3 * sa.pct(xs, 0.9):6.2f}  mean {1e3 * means[name]:6.2f} ms  {added}")
        print(f"the emulators' own mean TTFT: {pool.server_ttft_ms()} ms; "
              f"load {os.getloadavg()[0]:.2f}")
    finally:
        for r in started.values():
            r.stop()
        pool.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
