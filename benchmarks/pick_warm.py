"""The picker's pick, warm and cold: the same code's CPU when picks run back to back and
when each comes alone after a pause, as on the gateway's real path (grpc, asyncio and other
processes run between two picks and take the CPU's caches).

    .venv/bin/python benchmarks/pick_warm.py [--rounds 3] [--picks 2000] [--gap-ms 3]

The decision service as `benchmarks/gateway.py` runs it (the simulated fleet, 220 instances,
its refresher, an audit log in group mode), two instances with endpoints of the benchmark's
model (`fraud-scorer-lite`: no budget), and its endpoint picker following an access log
(`headers_only`, as `policyc gateway` runs it). No Envoy and no gRPC: the pick
(`EndpointPicker._request_headers`) is called on the serving loop with the request headers
h2load's requests carry. Each pick's CPU is the serving thread's (`time.thread_time` around
the call alone; what the loop runs between picks, the refresher's steps, is not counted):
- warm: picks in bursts of 8, then a pause of 4 x `--gap-ms` (so the refresher keeps the
  snapshot fresh and each tick's shares do not run out: ~670 picks/s at 3 ms, about the
  gateway benchmark's rate at 8 callers);
- cold: one pick, then a pause of `--gap-ms`;
and, warm, its parts one at a time in a hot loop (the header view, the shape key, the
decision without and with the placer, the audit record, the plan of the answer and its
bytes). The medians of the rounds are printed with the load: what the pick's own Python
costs, against what it costs on a machine that runs other work between picks.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
# this folder's `validate.py` would shadow the `validate` package Envoy's protobuf stubs import
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO / "tests" / "gateway"))

MODEL = "fraud-scorer-lite"
HEADERS = ((":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
           (":authority", "127.0.0.1:10000"), ("content-type", "application/grpc"), ("te", "trailers"),
           ("user-agent", "h2load nghttp2/1.59.0"), ("x-model", MODEL), ("x-data-region", "us-west"),
           ("x-tenant", "acme-bank"), ("x-forwarded-proto", "http"),
           ("x-request-id", "5d5b9a3e-5e4b-4a55-9c62-1f1e1b0b0b0b"), ("x-envoy-expected-rq-timeout-ms", "30000"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--picks", type=int, default=2000, help="picks per mode and round")
    ap.add_argument("--gap-ms", type=float, default=3.0, help="the pause after each burst (warm) or pick (cold)")
    args = ap.parse_args()
    if args.rounds < 1 or args.picks < 8 or not 0 < args.gap_ms <= 100:
        raise SystemExit("pick_warm.py: --rounds >= 1, --picks >= 8 and 0 < --gap-ms <= 100")

    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
    from gateway_rig import SMALL, pool_layout

    from policyc.compiler.pipeline import compile_paths
    from policyc.gateway import messages
    from policyc.gateway.access_log import AccessLogReceiver
    from policyc.gateway.pick import plan_pick
    from policyc.gateway.picker import PickerConfig
    from policyc.gateway.request_view import shape_key
    from policyc.gateway.server import PickerServer
    from policyc.server.app import DecisionServer, ServerThread
    from policyc.server.config import EnforcerMode, ServeConfig
    from policyc.server.fleet import admissible_fleet

    work = Path(tempfile.mkdtemp(prefix="policyc-bench-pick-"))
    bundle = compile_paths([str(REPO / "policies")], analyse=False).bundle
    assert bundle is not None
    server = DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE, audit_log=work / "audit.db"))
    thread = ServerThread(server)
    thread.start()
    try:
        assert server.cluster is not None and server.audit is not None
        server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots()))
        slots = [s for s in pool_layout(bundle, server, primaries=2) if s.model == "fraud-scorer"]
        server.engine.register_many([s.instance.model_copy(update={
            "id": s.instance_id.replace("fraud-scorer@", f"{MODEL}@"), "model": MODEL,
            "deployment": s.instance.deployment.model_copy(update={"endpoint": f"127.0.0.1:{40000 + i}"})})
            for i, s in enumerate(slots)])
        picker = PickerServer(server, PickerConfig(headers_only=True)).picker
        picker.follow_access_log(AccessLogReceiver(None, every_attempt=False))
        req = ep.ProcessingRequest()
        for k, v in HEADERS:
            req.request_headers.headers.headers.append(base_pb2.HeaderValue(key=k, raw_value=v.encode()))
        gap = args.gap_ms / 1e3
        tt = time.thread_time

        async def picks(n: int, burst: int, pause: float) -> tuple[float, int]:
            """CPU seconds per pick (the pick alone) and how many were forwarded."""
            cpu, forwarded = 0.0, 0
            for i in range(n):
                t0 = tt()
                _, pick = await picker._request_headers(req)
                cpu += tt() - t0
                forwarded += pick is not None
                if i % burst == burst - 1:
                    await asyncio.sleep(pause)
            return cpu / n, forwarded

        async def parts() -> dict[str, float]:
            """Each part alone in a hot loop, us a call."""
            _, pick = await picker._request_headers(req)
            assert pick is not None, "the pick was refused: nothing to time"
            service, shapes = picker.service, picker.shapes
            headers = req.request_headers.headers.headers
            policy = picker._view.of(headers)
            key = shape_key(policy)
            entry = shapes.get(service.engine.state, key)
            assert entry is not None
            engine, placer, audit = service.engine, getattr(service.engine, "placer", None), service.audit
            assert placer is not None and audit is not None
            d = engine.decide_prepared(entry.prepared, entry.memo, 1e-5)
            assert d.plan is not None
            plan = d.plan
            place = placer.place
            out: dict[str, float] = {}

            def timed(name: str, fn: Callable[[], Any], n: int = 2000) -> None:
                t0 = tt()
                for _ in range(n):
                    fn()
                out[name] = (tt() - t0) / n * 1e6

            timed("header view", lambda: picker._view.of(headers))
            timed("shape key", lambda: shape_key(policy))
            placer.place = lambda *a, **k: plan  # type: ignore[method-assign]  # the decision less the placer
            try:
                timed("decision without the placer", lambda: engine.decide_prepared(entry.prepared, entry.memo, 1e-5))
            finally:
                placer.place = place  # type: ignore[method-assign]
            mt = engine._matched(entry.prepared, entry.memo)
            _, contract, cands, budget, session = mt.tries[0]

            def placed() -> None:  # each call from a fresh tick's shares, as the first pick of a tick
                placer._reserved_version = -1
                place(cands, budget, contract, session)

            timed("placer (fresh shares each call)", placed)
            timed("audit record (draft, batch hand-over)", lambda: audit.record(d, entry.prepared.input.headers))
            table = picker.tables.current()
            timed("plan of the answer", lambda: plan_pick(d, table, picker.pool, 1e-4, None))
            timed("answer bytes", lambda: messages.forward_bytes(pick, False, False))
            return out

        thread.call(picks(500, 8, 4 * gap))  # shapes, memos and caches made
        found: dict[str, list[float]] = {"warm": [], "cold": []}
        shares: list[dict[str, float]] = []
        for _ in range(args.rounds):
            for mode, burst, pause in (("warm", 8, 4 * gap), ("cold", 1, gap)):
                time.sleep(0.3)
                cpu, forwarded = thread.call(picks(args.picks, burst, pause), timeout=600)
                if forwarded < args.picks:
                    print(f"  ({mode}: {args.picks - forwarded} of {args.picks} picks refused; "
                          f"the picker's counts {picker.counts})")
                found[mode].append(cpu)
            time.sleep(0.3)
            shares.append(thread.call(parts(), timeout=600))
        warm, cold = (statistics.median(found[m]) * 1e6 for m in ("warm", "cold"))
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {len(server.engine.state.registry)} "
              f"instances registered; {args.rounds} rounds of {args.picks} picks a mode, {args.gap_ms:g} ms pauses")
        print(f"  the pick, warm (bursts of 8): {warm:.1f} us CPU ({', '.join(f'{x * 1e6:.0f}' for x in found['warm'])})")
        print(f"  the pick, cold (one, then a pause): {cold:.1f} us CPU ({', '.join(f'{x * 1e6:.0f}' for x in found['cold'])}); "
              f"cold / warm {cold / warm:.2f}")
        names = list(shares[0])
        print("  its parts, warm (hot loop, median of rounds): " + ", ".join(
            f"{n} {statistics.median(s[n] for s in shares):.1f} us" for n in names))
        print(f"  load average after {os.getloadavg()[0]:.2f}")
    finally:
        thread.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
