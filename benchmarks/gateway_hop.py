"""The ext_proc hop alone: what one Endpoint Picker Protocol stream costs the picker's
process in each grpcio server shape, measured as CPU per stream of that process.

    .venv/bin/python benchmarks/gateway_hop.py [--seconds 2] [--rounds 3] [--concurrency 1,8] [--variants aio,sync-4,...]

A variant may carry gRPC core's environment: `aio-lean@GRPC_EXPERIMENTS=-event_engine_callback_cq`
(the server process of that variant alone runs with it).

Each variant is a server process of its own on a Unix socket, answering every stream as
the picker does when it follows Envoy's access log: read the request-headers message (the
headers Envoy sends for a gRPC call through the gateway), write one prebuilt forward
answer (`messages.forward_bytes` of a pick), end the stream. The load is nghttp2's
`h2load` on one HTTP/2 connection carrying `concurrency` streams (as Envoy's ext_proc
client multiplexes its streams on one connection), each stream one gRPC-framed
`ProcessingRequest` body. The variants run round by round, interleaved, so a loaded
machine's drift falls on all of them; reported: streams/s, p50, and the server process's
CPU per stream (user + system from /proc, its idle rate subtracted; the median of the
rounds and their range).

What it decides: `gateway/server.py` serves the picker in the cheapest shape found here
(benchmarks/RESULTS.md, gateway section, lists every variant's row).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

# what each variant's server process runs: `serve(variant, socket path)`
VARIANTS = {
    "aio": "grpc.aio server, generic handler, context.read/write (the picker's shape before)",
    "aio-lean": "grpc.aio server with channelz, the HTTP/2 BDP probe and retries off, no per-call compression",
    "aio-gen": "grpc.aio server, handler an async generator (async for / yield)",
    "aio-raw": "aio-lean, requests handed over as bytes, parsed in the handler (no deserializer call by grpc)",
    "aio-unary-in": "grpc.aio server, the method registered as unary-request (grpc reads the first message, context.read the rest; the picker's shape)",
    "aio-unary": "grpc.aio server, the method registered as unary-unary: grpc reads the first message, the handler returns the answer (message and status in one batch; the picker's shape when it follows the access log)",
    "sync-4": "grpc sync server, thread pool of 4",
    "sync-16": "grpc sync server, thread pool of 16",
}

LEAN_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.enable_channelz", 0), ("grpc.http2.bdp_probe", 0),
                ("grpc.enable_retries", 0), ("grpc.default_compression_algorithm", 0)]


def _request_bytes() -> bytes:
    """A gRPC-framed `ProcessingRequest` with the request headers Envoy hands the picker
    for a gRPC call through the gateway (pseudo-headers, Envoy's own, the caller's)."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    req = ep.ProcessingRequest()
    hs = req.request_headers.headers.headers
    for k, v in ((":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1:10000"),
                 (":path", "/inference.GRPCInferenceService/ModelInfer"), ("content-type", "application/grpc"),
                 ("te", "trailers"), ("user-agent", "grpc-python/1.85"), ("x-model", "fraud-scorer-lite"),
                 ("x-data-region", "us-west"), ("x-tenant", "acme-bank"), ("x-forwarded-proto", "http"),
                 ("x-request-id", "3f2b6a52-7c1e-4d0e-9a57-2c1f0c8e4b11")):
        hs.append(base_pb2.HeaderValue(key=k, raw_value=v.encode()))
    req.request_headers.end_of_stream = False
    raw = req.SerializeToString()
    return b"\0" + len(raw).to_bytes(4, "big") + raw


def _answer() -> bytes:
    from policyc.gateway.messages import forward_bytes
    from policyc.gateway.pick import Pick

    return forward_bytes(Pick("0" * 32, "m", "m@i", "127.0.0.1:9000", "host/gpu0", (), None, None, None, (), 0.0, 0),
                         False, False)


def serve(variant: str, path: str) -> None:
    """Serve the ext_proc method in `variant`'s shape on `path` until killed (prints `ready`)."""
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    answer = _answer()
    parse = ep.ProcessingRequest.FromString
    name = "envoy.service.ext_proc.v3.ExternalProcessor"

    def ident(b: bytes) -> bytes:
        return b

    if variant.startswith("sync"):
        from concurrent.futures import ThreadPoolExecutor

        def process_sync(it, context):  # type: ignore[no-untyped-def]
            for req in it:
                if req.HasField("request_headers"):
                    yield answer
                    return

        server = grpc.server(ThreadPoolExecutor(int(variant.split("-")[1])), options=[("grpc.so_reuseport", 0)])
        h = grpc.stream_stream_rpc_method_handler(process_sync, request_deserializer=parse, response_serializer=ident)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, {"Process": h}),))
        server.add_insecure_port(f"unix:{path}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return

    import asyncio

    async def process_rw(it, context):  # type: ignore[no-untyped-def]
        while True:
            req = await context.read()
            if req is grpc.aio.EOF:
                return
            if req.HasField("request_headers"):
                await context.write(answer)
                return

    async def process_raw(it, context):  # type: ignore[no-untyped-def]
        while True:
            raw = await context.read()
            if raw is grpc.aio.EOF:
                return
            if parse(raw).HasField("request_headers"):
                await context.write(answer)
                return

    async def process_one(req, context):  # type: ignore[no-untyped-def]
        if req.HasField("request_headers"):
            await context.write(answer)

    async def process_unary(req, context):  # type: ignore[no-untyped-def]
        return answer if req.HasField("request_headers") else b""

    async def process_gen(it, context):  # type: ignore[no-untyped-def]
        async for req in it:
            if req.HasField("request_headers"):
                yield answer
                return

    async def main() -> None:
        options = LEAN_OPTIONS if variant in ("aio-lean", "aio-raw") else [("grpc.so_reuseport", 0)]
        server = grpc.aio.server(options=options)
        fn, de = {"aio": (process_rw, parse), "aio-lean": (process_rw, parse), "aio-gen": (process_gen, parse),
                  "aio-raw": (process_raw, None), "aio-unary-in": (process_one, parse),
                  "aio-unary": (process_unary, parse)}[variant]
        if variant == "aio-unary-in":
            h = grpc.unary_stream_rpc_method_handler(process_one, request_deserializer=parse, response_serializer=ident)
        elif variant == "aio-unary":
            h = grpc.unary_unary_rpc_method_handler(process_unary, request_deserializer=parse, response_serializer=ident)
        else:
            h = grpc.stream_stream_rpc_method_handler(fn, request_deserializer=de, response_serializer=ident)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, {"Process": h}),))
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _h2load(path: str, body: Path, concurrency: int, seconds: float) -> tuple[int, float, float]:
    """(streams done, streams/s, p50 ms) of one closed-loop round after a 0.3 s warm-up."""
    log = body.with_suffix(".log")
    log.unlink(missing_ok=True)
    out = subprocess.run(["h2load", "-B", f"unix:{path}", "-t", "1", "-c", "1", "-m", str(concurrency),
                          "-D", f"{int(seconds * 1000)}ms", "--warm-up-time", "300ms", "-d", str(body),
                          "-H", "content-type: application/grpc", "-H", "te: trailers", "--log-file", str(log),
                          "http://picker/envoy.service.ext_proc.v3.ExternalProcessor/Process"],
                         capture_output=True, text=True, timeout=seconds + 60)
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out.stdout)
    rate = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out.stdout)
    if out.returncode != 0 or not (done and rate):
        raise SystemExit(f"h2load failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    lat = sorted(int(line.split()[2]) / 1e3 for line in log.read_text().splitlines() if line.strip())
    return int(done.group(1)), float(rate.group(1)), (lat[len(lat) // 2] if lat else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--serve", nargs=2, metavar=("VARIANT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return 0
    if shutil.which("h2load") is None:
        raise SystemExit("benchmarks/gateway_hop.py: `h2load` is not installed (Debian: apt-get install nghttp2-client)")
    variants = args.variants.split(",")
    bad = [v for v in variants if v.split("@")[0] not in VARIANTS or ("@" in v and "=" not in v)]
    if bad:
        raise SystemExit(f"benchmarks/gateway_hop.py: unknown variant(s) {', '.join(bad)}; known: {', '.join(VARIANTS)}")
    work = Path(tempfile.mkdtemp(prefix="policyc-hop-"))
    body = work / "request.grpc"
    body.write_bytes(_request_bytes())
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for v in variants:
            base, _, env = v.partition("@")
            k, _, val = env.partition("=")
            p = procs[v] = subprocess.Popen([sys.executable, __file__, "--serve", base, str(work / f"{len(procs)}.sock")],
                                            stdout=subprocess.PIPE, text=True, cwd=REPO,
                                            env={**os.environ, k: val} if k else None)
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"variant {v}: the server did not start")
        idle: dict[str, float] = {}
        c0 = {v: _cpu_s(p.pid) for v, p in procs.items()}
        t0 = time.perf_counter()
        time.sleep(1.0)
        for v, p in procs.items():
            idle[v] = (_cpu_s(p.pid) - c0[v]) / (time.perf_counter() - t0)
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds x "
              f"{args.seconds:g} s per variant; h2load on one HTTP/2 connection, Unix socket; one request-headers message "
              f"({body.stat().st_size} bytes framed) and one prebuilt answer per stream")
        for conc in (int(c) for c in args.concurrency.split(",")):
            rates: dict[str, list[float]] = {v: [] for v in variants}
            p50s: dict[str, list[float]] = {v: [] for v in variants}
            cpu: dict[str, list[float]] = {v: [] for v in variants}  # per round: CPU s per stream
            for r in range(args.rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for v in order:
                    pid = procs[v].pid
                    c, t = _cpu_s(pid), time.perf_counter()
                    n, rate, p50 = _h2load(str(work / f"{variants.index(v)}.sock"), body, conc, args.seconds)
                    # streams in the measured phase plus the warm-up's (at the same rate): what the CPU paid for
                    cpu[v].append((_cpu_s(pid) - c - idle[v] * (time.perf_counter() - t)) / max(n + int(rate * 0.3), 1))
                    rates[v].append(rate)
                    p50s[v].append(p50)
            for v in variants:
                print(f"  concurrency {conc:>2} {v:>9}: {statistics.median(rates[v]):7.0f} streams/s "
                      f"(rounds {min(rates[v]):.0f}-{max(rates[v]):.0f}), p50 {statistics.median(p50s[v]):.2f} ms, "
                      f"server CPU per stream {statistics.median(cpu[v]) * 1e6:.0f} us (rounds {min(cpu[v]) * 1e6:.0f}-"
                      f"{max(cpu[v]) * 1e6:.0f}; the least disturbed round is the minimum)  [{VARIANTS[v.split('@')[0]]}]")
        print(f"load average after {os.getloadavg()[0]:.2f}")
    finally:
        for p in procs.values():
            p.kill()
            p.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
