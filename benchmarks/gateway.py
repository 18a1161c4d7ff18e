"""Gateway benchmark: bounded closed-loop gRPC load through a real Envoy to the same real
KServe model servers, with policyc picking every request (ext_proc: the decision engine,
the placer, the audit log) against Envoy's own round-robin to the same servers, measured
in the same run, the modes alternating round by round so all see the same machine.

    .venv/bin/python benchmarks/gateway.py [--quick] [--seconds 4] [--rounds 3] [--concurrency 1,8] [--servers 2] [--client h2load]
                                           [--model fraud-scorer] [--breaks access-log|response] [--accounting]
    .venv/bin/python benchmarks/gateway.py --lag 12   # break -> act recorded, from Envoy's access log
    .venv/bin/python benchmarks/gateway.py --quick --otlp   # + a traced policyc gateway (`--otlp-endpoint`)

`--otlp` adds a fourth gateway: policyc as `policyc gateway --otlp-endpoint` runs it (Envoy's
OpenTelemetry tracer on every request, the picker's spans written as OTLP bytes on a thread
of their own, `gateway/tracing.py`, both exported to an OTLP/gRPC receiver in a process of
its own, `benchmarks/otlp_sink.py`), compared round by round with the untraced policyc
gateway; and a fifth, the same traced Envoy in front of the no-op ext_proc server, so
Envoy's tracer is measured without policyc's spans (`benchmarks/envoy_tracer.py` measures it
without an ext_proc call or a model server at all).

A third gateway, the same Envoy configuration with a no-op ext_proc server in place of
policyc (same Python grpc.aio, same event loop, same Unix socket transport, a fixed
answer), splits what policyc adds into the ext_proc hop and the decision itself. The model
is the cheapest the model servers serve (the `fraud-scorer-lite` contract's full variant on
4 tokens, ~0.1-0.3 ms of onnxruntime), so what the picker adds is visible. The decision
service runs in this process with the simulated fleet registered (placement at scale: the
pool's instances are a few among ~250), its refresher running and an audit log in group
mode; Envoy reaches the picker on its Unix socket and sends policyc its access log, from
which the picker learns breaks and request ends (one ext_proc exchange per call), as
`policyc gateway` runs it (`--breaks response`: the picker's response-phase path instead).

The load generator is nghttp2's `h2load` (C, one thread, one HTTP/2 connection carrying
the callers' streams, as one gRPC channel would): on a small machine a Python client would
spend as much CPU per request as the gateway and the ratio would measure the client.
`--client python` keeps the grpc.aio client (a second process). Reported per mode and
concurrency: requests/s, p50, p99 (client-observed), errors, and the CPU per request of
each process (policyc's processes, this one and every child but Envoy, the model servers and
h2load: the audit writer, shown on its own with its records and commits; the model servers;
both net of what they spend idle; Envoy; the client); then the p50 policyc adds and its
throughput as a share of round-robin's. `--profile PATH` profiles the serving loop during
policyc's rounds; `benchmarks/gateway_hop.py` times the ext_proc hop alone per grpcio shape.
"""

from __future__ import annotations

from policyc.client import operator_channel

import argparse
import asyncio
import cProfile
import multiprocessing as mp
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
# this folder's `validate.py` would shadow the `validate` package Envoy's protobuf stubs import
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO / "tests" / "gateway"))

if TYPE_CHECKING:
    from policyc.gateway.envoy_process import EnvoyProcess
    from policyc.gateway.server import PickerServer

LITE = "fraud-scorer-lite"


# `--otlp-parent unsampled`: every request carries a client's traceparent whose sampled flag is off
EXTRA_METADATA: list[tuple[str, str]] = []


def _metadata(model: str) -> tuple[tuple[str, str], ...]:
    return (("x-model", model), ("x-data-region", "us-west"), ("x-tenant", "acme-bank"), *EXTRA_METADATA)


def _client(target: str, model: str, concurrency: int, seconds: float, out: "mp.Queue[tuple[list[float], int, float]]") -> None:
    """Closed loop: `concurrency` callers, each sending its next request when the last is answered."""
    import grpc

    from policyc.modelserver.client import infer_request, token_ids
    from policyc.modelserver.oip import pb

    async def main() -> tuple[list[float], int, float]:
        req = infer_request(model, token_ids(4)).SerializeToString()
        md = _metadata(model)
        lat: list[float] = []
        errors = 0
        async with grpc.aio.insecure_channel(target) as ch:
            call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=None,
                                  response_deserializer=pb.ModelInferResponse.FromString)
            for _ in range(20):  # warm the connection and the shape caches
                await call(req, metadata=md, timeout=10)
            stop = time.perf_counter() + seconds

            async def caller() -> None:
                nonlocal errors
                while time.perf_counter() < stop:
                    t = time.perf_counter()
                    try:
                        await call(req, metadata=md, timeout=10)
                        lat.append(time.perf_counter() - t)
                    except grpc.aio.AioRpcError:
                        errors += 1

            t0 = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(concurrency)))
            return lat, errors, time.perf_counter() - t0

    out.put(asyncio.run(main()))


def _h2load_round(target: str, model: str, concurrency: int, seconds: float, body: Path, work: Path) -> tuple[list[float], int, float, float]:
    """One round with nghttp2's `h2load` (C, one thread, one HTTP/2 connection carrying
    `concurrency` streams: the same shape as one gRPC channel): closed loop for `seconds`
    after a 0.5 s warm-up. Latencies from its per-request log (microseconds to the end of
    each answer).
    Also returns h2load's own CPU seconds, so the report shows what the client spent.
    A refusal by the picker is HTTP 200 with a gRPC status, so the caller counts those from
    the picker's own counters."""
    log = work / "h2load.log"
    log.unlink(missing_ok=True)
    cmd = ["h2load", "-t", "1", "-c", "1", "-m", str(concurrency), "-D", f"{int(seconds * 1000)}ms", "--warm-up-time", "500ms",
           "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers",
           *[a for k, v in _metadata(model) for a in ("-H", f"{k}: {v}")], "--log-file", str(log),
           f"http://{target}/inference.GRPCInferenceService/ModelInfer"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"h2load failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, \d+ succeeded, (\d+) failed", out.stdout)
    rate = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out.stdout)
    codes = re.search(r"status codes: \d+ 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out.stdout)
    if not (done and rate and codes):
        raise SystemExit(f"h2load's report is not the one expected:\n{out.stdout}")
    lat = [int(line.split()[2]) / 1e6 for line in log.read_text().splitlines() if line.strip()]
    elapsed = int(done.group(1)) / max(float(rate.group(1)), 1e-9)  # the measured phase, warm-up excluded
    # streams that did not complete and answers that are not 2xx (a gRPC refusal is 200: counted
    # by the caller). Not "done - 2xx": h2load counts a status when the headers arrive and a
    # stream as done when it closes, so a stream across the warm-up's end is in one and not the
    # other, and that difference read as one error now and then where none was
    failed = int(done.group(2)) + sum(int(n) for n in codes.groups())
    return lat, failed, elapsed, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def _round(target: str, model: str, concurrency: int, seconds: float) -> tuple[list[float], int, float]:
    ctx = mp.get_context("spawn")
    q: "mp.Queue[tuple[list[float], int, float]]" = ctx.Queue()
    p = ctx.Process(target=_client, args=(target, model, concurrency, seconds, q))
    p.start()
    result = q.get(timeout=seconds + 120)
    p.join(30)
    return result


class _NoopPicker:
    """The baseline picker: the same Python grpc.aio ext_proc server on the same event loop,
    answering every request with the same kind of message (endpoint header and `envoy.lb`
    metadata, response phase off) without deciding anything, and ending the stream after
    it as policyc's picker does: what the ext_proc hop costs."""

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        from policyc.gateway.messages import forward
        from policyc.gateway.pick import Pick

        self._responses = [forward(Pick("0" * 32, "noop", "noop", e, "noop/gpu0", (), None, None, None, (), 0.0, 0)).SerializeToString()
                           for e in endpoints]  # serialized once, as the picker's answers are (`messages.forward_bytes`)
        self._n = 0

    async def Process(self, first, context):  # type: ignore[no-untyped-def]
        self._n += 1
        return self._responses[self._n % len(self._responses)]


async def _start_noop(endpoints: tuple[str, ...], unix_socket: str):  # type: ignore[no-untyped-def]
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from policyc.gateway.messages import serialize
    from policyc.gateway.server import EXT_PROC_SERVICE

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    # registered as the picker's is behind policyc's own Envoy (gateway/server.py, `headers_only`): unary-unary,
    # the first message handed over, the answer and the stream's end sent in one batch
    process = grpc.unary_unary_rpc_method_handler(_NoopPicker(endpoints).Process, request_deserializer=ep.ProcessingRequest.FromString,
                                                  response_serializer=serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(EXT_PROC_SERVICE, {"Process": process}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.add_insecure_port(f"unix:{unix_socket}")
    await server.start()
    return server, port


def _pick_parts(picker: object, placer: object, audit: object):  # type: ignore[no-untyped-def]
    """`pick_parts.PickParts` on the live picker (loaded by path: this folder is off sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pick_parts", Path(__file__).resolve().parent / "pick_parts.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PickParts(picker, placer, audit)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _profiling(prof: "cProfile.Profile", on: bool) -> None:
    """Start or stop `prof` on the thread this coroutine runs on (the serving loop's)."""
    if on:
        prof.enable()
    else:
        prof.disable()


def _descendants(root: int) -> dict[int, int]:
    """pid -> parent pid of every live process under `root` (from /proc)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                parent[int(d)] = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    out: dict[int, int] = {}
    frontier = [root]
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p and c not in out:
                out[c] = pp
                frontier.append(c)
    return out


def _policyc_pids(exclude: set[int]) -> list[int]:
    """This process and every process under it that is policyc's (the audit writer above
    all): all but the subtrees rooted at `exclude` (Envoy, the model servers and their
    zygote, the load generator: `exclude`'s pids and any process whose command line names
    the model server or h2load)."""
    tree = _descendants(os.getpid())
    out = [os.getpid()]
    for pid in tree:
        p, skip = pid, False
        while p != os.getpid() and not skip:
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes()
            except OSError:
                cmd = b""
            skip = p in exclude or b"policyc.modelserver" in cmd or b"h2load" in cmd
            p = tree.get(p, os.getpid())
        if not skip:
            out.append(pid)
    return out


def _thread_cpu_s(tid: int | None) -> float:
    """CPU seconds one of this process's threads has run so far (by its OS id; the scheduler's
    nanosecond count, /proc/self/task/TID/schedstat, finer than the 10 ms ticks of `stat`)."""
    if tid is None:
        return 0.0
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9


def _cpu_sum(pids: list[int]) -> float:
    """`_cpu_s` summed over `pids` (a process gone meanwhile counts nothing)."""
    total = 0.0
    for p in pids:
        try:
            total += _cpu_s(p)
        except OSError:
            pass
    return total


def _requests(envoy: "EnvoyProcess") -> int:
    """Requests this gateway's Envoy has taken so far (warm-up included)."""
    name = "http.policyc_gateway.downstream_rq_total"
    return envoy.stats(name).get(name, 0)


def _refusals(picker: "PickerServer | None", mode: str) -> int:
    """Requests policyc's picker refused so far (immediate responses: HTTP 200 with a gRPC
    status for a gRPC caller, so h2load cannot count them)."""
    if picker is None:
        return 0
    return sum(n for what, n in picker.picker.counts.items() if what not in ("forwarded", "broken", "unlogged"))


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3 if s else float("nan")


def _break_lag(n: int) -> int:
    """Break -> act recorded: the broken attempt's end (Envoy's access log) to the picker's
    acts, and the client's answer to the acts, for `n` stalled requests."""
    import grpc

    from gateway_rig import BACKUP, PRIMARY, start_gateway

    from policyc.compiler.pipeline import compile_paths
    from policyc.modelserver.client import OipClient, token_ids

    bundle = compile_paths([str(REPO / "policies")], analyse=False).bundle
    assert bundle is not None
    gw = start_gateway(bundle)
    md = (("x-model", PRIMARY), ("x-data-region", "us-west"), ("x-tenant", "acme-bank"), ("x-policyc-stall-ms", "2000"))
    lags: list[float] = []
    seen: list[float] = []
    refused = 0
    try:
        with OipClient(gw.listen) as c:
            c.infer(BACKUP, token_ids(32), metadata=(("x-model", BACKUP),) + md[1:3], timeout=10)  # connections up
            while len(lags) < n and refused < 3 * n:
                time.sleep(1.0)  # each break costs its GPU 0.3 of health, regained at 0.1 a second
                try:
                    a = c.infer(PRIMARY, token_ids(32), metadata=md, timeout=10)
                except grpc.RpcError:
                    refused += 1
                    continue
                answered = time.monotonic()
                acts = gw.picker.acts.of(a.decision_id, 3, timeout=5)
                seen.append(time.monotonic() - answered)
                b = next((b for b in gw.picker.acts.breaks if b.decision_id == a.decision_id), None)
                if len(acts) < 3 or b is None or b.lag_s is None:
                    raise SystemExit(f"request {a.decision_id}: the break was not recorded from the access log")
                lags.append(b.lag_s)
    finally:
        gw.stop()
    q = statistics.quantiles(lags, n=10) if len(lags) >= 2 else lags
    print(f"{len(lags)} breaks (flush interval 50 ms): break -> acts recorded p50 {statistics.median(lags) * 1e3:.1f} ms, "
          f"p90 {q[-1] * 1e3:.1f} ms, max {max(lags) * 1e3:.1f} ms; the client's answer -> acts p50 "
          f"{statistics.median(seen) * 1e3:.1f} ms, max {max(seen) * 1e3:.1f} ms; {refused} refused while GPUs recovered; "
          f"load average {os.getloadavg()[0]:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", metavar="PATH",
                    help="profile the serving event loop (cProfile, CPU time) during policyc's rounds; stats to PATH, "
                         "the top functions printed")
    ap.add_argument("--quick", action="store_true", help="2 s rounds, 3 of them (a loaded machine's run in about a minute a phase)")
    ap.add_argument("--concurrency", default="1,8", help="closed-loop callers, comma-separated phases")
    ap.add_argument("--servers", type=int, default=2, help="model-server processes (one instance each)")
    ap.add_argument("--client", choices=("h2load", "python"), default="h2load",
                    help="the load generator: h2load (C, cheap: the cores go to the system under test) or Python grpc.aio")
    ap.add_argument("--model", choices=(LITE, "fraud-scorer"), default=LITE,
                    help="the instances' contract: fraud-scorer has budget breakers, so the picker also sees each answer")
    ap.add_argument("--breaks", choices=("access-log", "response"), default="access-log",
                    help="how the picker learns of breaks: Envoy's access log (as `policyc gateway` runs it: one "
                         "ext_proc exchange per call) or the response phase (requests with a budget: two)")
    ap.add_argument("--accounting", action="store_true",
                    help="with --breaks access-log: also write each call's accounting record to the audit log")
    ap.add_argument("--otlp", action="store_true",
                    help="also a traced policyc gateway (Envoy's tracer and the picker's spans to an OTLP receiver), "
                         "its throughput against the untraced one's, round by round")
    ap.add_argument("--otlp-parent", choices=("none", "unsampled"), default="none",
                    help="with --otlp: none (Envoy starts and samples a trace per request) or unsampled (each request "
                         "carries a client's traceparent with the sampled flag off: parent-based sampling, the cost "
                         "of tracing switched on for requests that are not traced)")
    ap.add_argument("--otlp-sampling", type=float, default=100.0, metavar="PERCENT",
                    help="with --otlp: the share of requests Envoy samples (`policyc gateway --otlp-sampling`; default 100)")
    ap.add_argument("--parts", action="store_true",
                    help="also where the picker's CPU goes, as thread CPU on the serving loop inside the real path: the "
                         "pick, the placer's place and the audit record within it, against the loop and the process "
                         "(benchmarks/pick_parts.py)")
    ap.add_argument("--lag", type=int, default=0, metavar="N",
                    help="instead: N requests stalled on their primary (broken at the budget, answered by the backup), "
                         "one a second, through the test rig's gateway; prints how long after the break the acts were "
                         "recorded from Envoy's access log")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.rounds = 2.0, 3
    if args.otlp_parent == "unsampled":  # the same header for every gateway: only the traced one reads it
        EXTRA_METADATA.append(("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"))
    if args.lag:
        return _break_lag(args.lag)


    from gateway_rig import SMALL, free_port, pool_layout

    from policyc.compiler.pipeline import compile_paths
    from policyc.gateway.access_log import AccessLogReceiver, AccessLogServer
    from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap
    from policyc.gateway.envoy_process import EnvoyProcess
    from policyc.gateway.picker import PickerConfig
    from policyc.gateway.server import PickerServer
    from policyc.modelserver.client import infer_request, token_ids
    from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
    from policyc.modelserver.model_files import write_model_files
    from policyc.server import convert
    from policyc.server.app import DecisionServer, ServerThread
    from policyc.server.config import EnforcerMode, ServeConfig
    from policyc.server.fleet import admissible_fleet
    from policyc.server.proto import pb_grpc

    work = Path(tempfile.mkdtemp(prefix="policyc-bench-gw-"))
    bundle = compile_paths([str(REPO / "policies")], analyse=False).bundle
    assert bundle is not None
    server = DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE, audit_log=work / "audit.db"))
    thread = ServerThread(server)
    thread.start()
    assert server.cluster is not None
    server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots()))
    slots = [s for s in pool_layout(bundle, server, primaries=args.servers) if s.model == "fraud-scorer"]
    lite = write_model_files(bundle.contract(args.model), work / "models")  # type: ignore[arg-type]
    models = ModelPool([ServerSpec((InstanceSpec(s.instance_id.replace("fraud-scorer@", f"{args.model}@"),
                                                 lite.full),))
                        for s in slots], workdir=work / "servers").start(timeout=60)
    envoys: list[EnvoyProcess] = []
    sink: subprocess.Popen[str] | None = None  # `--otlp`: the OTLP receiver's process
    try:
        with operator_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for s, inst in zip(slots, models.instances):
                reg = s.instance.model_copy(update={"id": inst.instance_id, "model": args.model, "deployment":
                                                    s.instance.deployment.model_copy(update={"endpoint": inst.endpoint})})
                stub.RegisterInstance(convert.register_request(reg, onnx_model=lite.full.read_bytes()), timeout=10)
        # as `policyc gateway` runs it (gateway/runner.py): Envoy reaches the picker on its Unix socket
        # and sends policyc its access log, from which the picker learns breaks and request ends
        # (following that log, it is told so before it starts: its method is then unary-unary, `headers_only`)
        picker = PickerServer(server, PickerConfig(unix_socket=str(work / "picker.sock"),
                                                   headers_only=args.breaks == "access-log"))
        als: AccessLogServer | None = None
        if args.breaks == "access-log":
            assert server.audit is not None
            als = AccessLogServer(AccessLogReceiver(server.audit.accounting if args.accounting else None,  # as `policyc gateway`
                                                    every_attempt=False))
            picker.picker.follow_access_log(als.receiver)
        picker_port = thread.call(picker.start())
        als_at: str | None = thread.call(als.start()) if als is not None else None
        endpoints = tuple(i.endpoint for i in models.instances)
        noop, _ = thread.call(_start_noop(endpoints, str(work / "noop.sock")))
        modes = [("policyc", True, f"unix:{work / 'picker.sock'}"), ("no-op ext_proc", True, f"unix:{work / 'noop.sock'}"),
                 ("round-robin", False, f"127.0.0.1:{picker_port}")]
        otlp_at: str | None = None
        if args.otlp:  # a second picker, the same decision service, tracing (as `policyc gateway --otlp-endpoint`)
            from policyc.gateway.tracing import PickerTracer

            sink = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "otlp_sink.py")], stdout=subprocess.PIPE, text=True)
            assert sink.stdout is not None
            otlp_at = f"127.0.0.1:{sink.stdout.readline().split()[1]}"
            traced = PickerServer(server, PickerConfig(unix_socket=str(work / "picker-traced.sock"), headers_only=als is not None))
            traced.picker.tracer = PickerTracer(otlp_at)
            if als is not None:
                traced.picker.follow_access_log(als.receiver)
            thread.call(traced.start())
            modes.insert(1, ("policyc traced", True, f"unix:{work / 'picker-traced.sock'}"))
            # Envoy's tracer alone: the same traced Envoy in front of the no-op ext_proc server (no picker spans)
            modes.insert(3, ("no-op traced", True, f"unix:{work / 'noop.sock'}"))
        targets = {}
        pickers = {"policyc": picker, **({"policyc traced": traced} if args.otlp else {})}
        for mode, use, picker_at in modes:
            listen = f"127.0.0.1:{free_port()}"
            policyc = mode in pickers
            spec = GatewaySpec(picker=picker_at, listen=listen, admin=f"127.0.0.1:{free_port()}",
                               endpoints=endpoints, use_picker=use, access_log_cluster=als_at if policyc else None,
                               breaks_from_access_log=policyc and als_at is not None,
                               log_every_call=not (policyc and als_at is not None) or args.accounting,
                               log_every_attempt=not (policyc and als_at is not None),
                               otlp_endpoint=otlp_at if mode in ("policyc traced", "no-op traced") else None,
                               otlp_sampling=args.otlp_sampling)
            envoys.append(EnvoyProcess(build_bootstrap(spec), work / mode.replace(" ", "-")).start())
            targets[mode] = listen
        phases = [int(c) for c in args.concurrency.split(",")]
        prof = cProfile.Profile(time.thread_time) if args.profile else None
        parts = _pick_parts(picker.picker, getattr(server.engine, "placer", None), server.audit) if args.parts else None
        client = args.client
        if client == "h2load" and shutil.which("h2load") is None:
            raise SystemExit("benchmarks/gateway.py: `h2load` is not installed (Debian: apt-get install nghttp2-client, "
                             "which scripts/setup.sh does); or run with --client python")
        body = work / "request.grpc"
        message = infer_request(args.model, token_ids(4)).SerializeToString()
        body.write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)
        model_pids = [p.pid for p in models.processes if p.pid is not None]
        assert server.audit is not None
        audit_log = server.audit.log
        # policyc's processes: this one (decision service, picker) and the audit writer it started
        # (the OTLP receiver stands for a collector elsewhere: not policyc's)
        pols = _policyc_pids({e.pid for e in envoys if e.pid is not None} | set(model_pids) | ({sink.pid} if sink else set()))
        others = [p for p in pols if p != os.getpid()]
        t, c, m = time.perf_counter(), _cpu_sum(pols), sum(_cpu_s(p) for p in model_pids)
        time.sleep(2.0)
        # what policyc's processes (placer refresher, audit, readiness) and the model servers spend with no load
        idle_rate = (_cpu_sum(pols) - c) / (time.perf_counter() - t)
        model_idle = (sum(_cpu_s(p) for p in model_pids) - m) / (time.perf_counter() - t)
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {len(endpoints)} model servers, "
              f"{len(server.engine.state.registry)} instances registered; {args.rounds} rounds x {args.seconds:g} s per mode; "
              f"client {client}; model {args.model}; breaks from the {args.breaks.replace('-', ' ')}"
              f"{', accounting records on' if als is not None and args.accounting else ''}; "
              f"policyc processes: {len(pols)} (this one, the audit writer {others}); "
              f"idle: policyc processes {idle_rate * 1e3:.0f} ms CPU/s, model servers {model_idle * 1e3:.0f} ms CPU/s "
              "(subtracted below)")
        for conc in phases:
            res: dict[str, list[tuple[list[float], int, float]]] = {m: [] for m in targets}
            # CPU s of policyc's processes (all), Envoy, the client, the model servers, policyc's processes but this one
            cpu: dict[str, list[float]] = {m: [0.0, 0.0, 0.0, 0.0, 0.0] for m in targets}
            served = dict.fromkeys(targets, 0)
            refused = dict.fromkeys(targets, 0)
            commits = dict.fromkeys(targets, 0)  # the audit writer's commits (each an fsync) and records
            records = dict.fromkeys(targets, 0)
            sink_cpu = dict.fromkeys(targets, 0.0)  # `--otlp`: the OTLP receiver's (a collector elsewhere: not counted above)
            loop_cpu = dict.fromkeys(targets, 0.0)  # the serving loop's thread (the pickers' and the no-op's coroutines)
            parts_at = parts.snapshot() if parts is not None else None
            for _ in range(args.rounds):
                for (mode, target), envoy in zip(targets.items(), envoys):
                    c0, w0, e0, t0 = _cpu_sum(pols), _cpu_sum(others), _cpu_s(envoy.pid or 0), time.perf_counter()
                    q0, m0, r0 = _requests(envoy), sum(_cpu_s(p) for p in model_pids), _refusals(pickers.get(mode), mode)
                    s0 = _cpu_sum([sink.pid]) if sink is not None else 0.0
                    l0 = _thread_cpu_s(thread.native_id)
                    k0, a0 = audit_log.commits, audit_log.acked
                    if prof is not None and mode == "policyc":
                        thread.call(_profiling(prof, True))
                    if client == "h2load":
                        lat, failed, elapsed, client_cpu = _h2load_round(target, args.model, conc, args.seconds, body, work)
                        res[mode].append((lat, failed, elapsed))
                    else:
                        res[mode].append(_round(target, args.model, conc, args.seconds))
                        client_cpu = float("nan")
                    wall = time.perf_counter() - t0
                    if prof is not None and mode == "policyc":
                        thread.call(_profiling(prof, False))
                    cpu[mode][0] += _cpu_sum(pols) - c0 - idle_rate * wall
                    cpu[mode][4] += _cpu_sum(others) - w0
                    cpu[mode][1] += _cpu_s(envoy.pid or 0) - e0
                    cpu[mode][2] += client_cpu
                    cpu[mode][3] += sum(_cpu_s(p) for p in model_pids) - m0 - model_idle * wall
                    served[mode] += _requests(envoy) - q0
                    refused[mode] += _refusals(pickers.get(mode), mode) - r0
                    commits[mode] += audit_log.commits - k0
                    records[mode] += audit_log.acked - a0
                    sink_cpu[mode] += (_cpu_sum([sink.pid]) if sink is not None else 0.0) - s0
                    loop_cpu[mode] += _thread_cpu_s(thread.native_id) - l0
            summary = {}
            for mode, rounds in res.items():
                lat = [x for r in rounds for x in r[0]]
                rates = [len(r[0]) / r[2] for r in rounds]
                errors = sum(r[1] for r in rounds) + refused[mode]
                summary[mode] = (statistics.median(rates), _pct(lat, 0.5), _pct(lat, 0.99))
                n = max(served[mode], 1)  # every request Envoy took, warm-up included: what the CPU was spent on
                print(f"  concurrency {conc:>2} {mode:>14}: {summary[mode][0]:8.0f} req/s (rounds {min(rates):.0f}-{max(rates):.0f}), "
                      f"p50 {summary[mode][1]:.2f} ms, p99 {summary[mode][2]:.2f} ms, errors {errors}; CPU per request: "
                      f"policyc processes {cpu[mode][0] / n * 1e6:.0f} us (audit writer {cpu[mode][4] / n * 1e6:.0f}), Envoy {cpu[mode][1] / n * 1e6:.0f} us, "
                      f"client {cpu[mode][2] / n * 1e6:.0f} us, model servers {cpu[mode][3] / n * 1e6:.0f} us; "
                      f"audit {records[mode]} records in {commits[mode]} commits")
            pc, rr, nop = summary["policyc"], summary["round-robin"], summary["no-op ext_proc"]
            print(f"  concurrency {conc:>2}: policyc adds {pc[1] - rr[1]:+.2f} ms at p50, {pc[2] - rr[2]:+.2f} ms at p99; "
                  f"throughput {pc[0] / rr[0]:.2f} x round-robin; of the p50 added, the ext_proc hop alone (no-op) "
                  f"{nop[1] - rr[1]:+.2f} ms, the decision {pc[1] - nop[1]:+.2f} ms; no-op throughput {nop[0] / rr[0]:.2f} x; "
                  f"load average {os.getloadavg()[0]:.2f}")

            def paired(mode: str) -> str:  # each round against the round-robin round next to it: the machine's drift cancels
                xs = sorted((len(a[0]) / a[2]) / (len(b[0]) / b[2]) for a, b in zip(res[mode], res["round-robin"]))
                return f"{statistics.median(xs):.2f} x (rounds {xs[0]:.2f}-{xs[-1]:.2f})"

            print(f"  concurrency {conc:>2}: round by round, policyc {paired('policyc')}, no-op {paired('no-op ext_proc')}")
            if parts is not None and parts_at is not None:
                print(f"  concurrency {conc:>2}: " + parts.line(
                    parts_at, parts.snapshot(), served["policyc"], loop_cpu["policyc"], cpu["policyc"][0], cpu["policyc"][4],
                    loop_cpu["no-op ext_proc"], cpu["no-op ext_proc"][0], served["no-op ext_proc"]))
            if args.otlp:  # the traced gateway against the untraced one, round by round
                xs = sorted((len(a[0]) / a[2]) / (len(b[0]) / b[2]) for a, b in zip(res["policyc traced"], res["policyc"]))
                print(f"  concurrency {conc:>2}: tracing on: {statistics.median(xs):.2f} x the untraced policyc gateway's "
                      f"throughput (rounds {xs[0]:.2f}-{xs[-1]:.2f}); p50 {summary['policyc traced'][1] - pc[1]:+.2f} ms, "
                      f"p99 {summary['policyc traced'][2] - pc[2]:+.2f} ms")

                def per_call(mode: str) -> list[float]:  # policyc's processes, Envoy, client, model servers: us a request
                    n = max(served[mode], 1)
                    return [cpu[mode][i] / n * 1e6 for i in (0, 1, 2, 3)]

                on, off = per_call("policyc traced"), per_call("policyc")
                print(f"  concurrency {conc:>2}: tracing's CPU a request: policyc processes {on[0] - off[0]:+.0f} us, Envoy "
                      f"{on[1] - off[1]:+.0f} us, client {on[2] - off[2]:+.0f} us, model servers {on[3] - off[3]:+.0f} us; "
                      f"untraced / traced CPU a request (all four) {sum(off) / sum(on):.3f}; the OTLP receiver (not counted) "
                      f"{sink_cpu['policyc traced'] / max(served['policyc traced'], 1) * 1e6:.1f} us a request")
                lp = {m: loop_cpu[m] / max(served[m], 1) * 1e6 for m in ("policyc", "policyc traced", "no-op ext_proc", "no-op traced")}
                print(f"  concurrency {conc:>2}: the serving loop's thread a request (its refresher steps included): policyc "
                      f"{lp['policyc']:.0f} us, traced {lp['policyc traced']:.0f} us ({lp['policyc traced'] - lp['policyc']:+.0f}); "
                      f"the no-op {lp['no-op ext_proc']:.0f} us, behind a traced Envoy {lp['no-op traced']:.0f} us "
                      f"({lp['no-op traced'] - lp['no-op ext_proc']:+.0f})")
                ys = sorted((len(a[0]) / a[2]) / (len(b[0]) / b[2]) for a, b in zip(res["no-op traced"], res["no-op ext_proc"]))
                non, noff = per_call("no-op traced"), per_call("no-op ext_proc")
                print(f"  concurrency {conc:>2}: Envoy's tracer alone (the no-op ext_proc, traced / not): {statistics.median(ys):.2f} x "
                      f"(rounds {ys[0]:.2f}-{ys[-1]:.2f}); Envoy {non[1] - noff[1]:+.0f} us a request, the ext_proc process "
                      f"{non[0] - noff[0]:+.0f} us; untraced / traced CPU a request (all four) {sum(noff) / sum(non):.3f}")
        if prof is not None:
            import pstats

            prof.dump_stats(args.profile)
            pstats.Stats(args.profile).sort_stats("tottime").print_stats(30)
        print(f"picker: {picker.picker.counts}; load average after {os.getloadavg()[0]:.2f}")
        if als is not None:
            print(f"access log: {als.receiver.counts}")
            thread.call(als.stop())
        thread.call(picker.stop())
        thread.call(noop.stop(0.1))
        if args.otlp:
            assert traced.picker.tracer is not None
            traced.picker.tracer.shutdown()  # the last spans out
            tracer = traced.picker.tracer
            print(f"traced picker: {traced.picker.counts}, {tracer.spans} picks traced; the exporter's thread (writing and "
                  f"sending the spans) {tracer.cpu_s / max(tracer.spans, 1) * 1e6:.1f} us CPU a pick, {tracer.cpu_s:.2f} s in all")
            thread.call(traced.stop())
            assert sink is not None
            sink.terminate()
            print(f"OTLP receiver: {sink.communicate(timeout=30)[0].strip()} (Envoy's and the picker's)")
    finally:
        for e in envoys:
            e.stop()
        if sink is not None and sink.poll() is None:
            sink.kill()
        thread.stop()
        models.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
