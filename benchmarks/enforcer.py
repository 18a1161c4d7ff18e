"""Enforcer benchmarks: break latency, kernel-plane throughput ratio, self-heal time.

1. Budget crossing -> stream cancelled, and -> kernel quarantine map updated (p50/p99), on
   real gRPC streams through the guardian (kernel plane when root, else user space), with
   100 watched requests in flight (started at a steady pace, then in groups of 10 whose
   crossings fall 200 us apart, each start half a start off the crossings; floor: cancel
   p99 <= 1 ms), with the quarantine action and without it, and once more with the
   starts on the crossings (the worst phase: the client's own starts hold gRPC's channel
   lock and the interpreter as its cancels want them). The backend is a process of its own (with
   the kernel plane, in a network namespace behind a veth pair). From the crossing (the
   deadline): to the client's cancel() returning (the floor's figure), to the RST_STREAM
   frame on the wire (the TC frame walker on the veth's host end, kernel clock), and to
   the backend seeing the stream end (the same monotonic clock).
2. Loopback request/response throughput in a private netns with the kernel plane's TC
   programs attached vs not, alternating phases in the same run (floor: >= 0.9).
3. Self-heal in the placer's simulator: ticks (200 ms each) and wall time from the first
   SM-collapse anomaly to the rebalance.
4. The decision service's per-tick GPU watch: every busy GPU's SM utilisation of a 2,048-GPU
   simulated cluster through `Guardian.observe_gpus`, against `observe_gpu` per GPU (the
   baseline, same run): milliseconds per tick on the serving loop.
5. Through real Envoy to real model servers (`bench_gateway`): throughput with the kernel
   plane attached to the data path vs detached (floor >= 0.93x), and with the audit log and
   per-call accounting from Envoy's access log vs no audit (floor >= 0.9x, 0 dropped), at
   one caller and at 16 (CPU-bound), short rounds alternating, each with the CPU per call of
   every process of the rig beside it (what explains a ratio; it moves less with load).

Usage: .venv/bin/python benchmarks/enforcer.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "fraud-scorer-lite"  # the gateway rounds: the backup's contract, cheap enough that placement never runs out of GPU share
sys.path.insert(0, str(ROOT / "tests" / "enforcer"))

import grpc  # noqa: E402
from conftest import make_bundle  # noqa: E402
from grpc_rig import stub  # noqa: E402

from policyc.compiler.bundle import Quarantine  # noqa: E402
from policyc.enforcer.collaborators import MemoryAudit  # noqa: E402
from policyc.enforcer.endpoint import Endpoint  # noqa: E402
from policyc.enforcer.executor import ActionExecutor  # noqa: E402
from policyc.enforcer.guardian import Guardian  # noqa: E402
from policyc.enforcer.plane import open_plane  # noqa: E402
from policyc.enforcer.records import ActionRecord  # noqa: E402

TICK_S = 0.2  # the placer's telemetry refresh
BURST_STEP = 0.0002  # seconds between the crossings of one group in the budget benchmark's bursts


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class _Sink:
    def report_anomaly(self, gpu_key: str, signal: str, value: float) -> None:
        pass


class _Tally:
    """An audit sink that counts records by kind and keeps none. A service's sink hands them
    to the audit writer's process; one that kept every record would grow the heap the
    collector scans, and the budget benchmark would time its full collections (90 ms once
    at 1,000 breaks, holding the interpreter) rather than the guardian."""

    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}

    def __call__(self, record: ActionRecord) -> None:
        self.kinds[record.kind.value] = self.kinds.get(record.kind.value, 0) + 1


STALL = textwrap.dedent("""
    # The budget benchmark's backend, in its own process as a model server is: each call
    # stalls for the milliseconds its body asks, and the CLOCK_MONOTONIC instant at which a
    # call's stream ended before it answered (the client's RST_STREAM arrived) is noted.
    import json, sys, threading, time
    from concurrent import futures
    import grpc
    ended, lock = {}, threading.Lock()
    def call(request, context):
        rid = dict(context.invocation_metadata()).get("request-id", "?")
        over = threading.Event()
        answered = threading.Event()
        def gone():
            t = time.monotonic()
            over.set()
            if not answered.is_set():
                with lock:
                    ended[rid] = t
        if not context.add_callback(gone):
            gone()
            return b""
        over.wait(float(request.decode() or "0") / 1e3)
        answered.set()
        return b"ok"
    handler = grpc.method_handlers_generic_handler(
        "policyc.test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call, lambda b: b, lambda b: b)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=256))
    server.add_generic_rpc_handlers((handler,))
    print(server.add_insecure_port(f"{sys.argv[1]}:0"), flush=True)
    server.start()
    sys.stdin.readline()
    with lock:
        print(json.dumps(ended), flush=True)
    server.stop(0)
""")


def bench_break(plane, n: int, *, quarantine: bool, concurrency: int = 100, slo: float = 0.2, burst: int = 1,  # type: ignore[no-untyped-def]
                starts_at_crossings: bool = False) -> None:
    """`n` requests through the guardian with `concurrency` of them in flight at once:
    started at a steady pace (one every budget / concurrency seconds), each served by a
    backend (its own process, as a model server is) that would take 1 s, so every one
    crosses its budget (92.5 % of `slo`) and is cancelled there; its stream's owner
    finishes it when the call ends. With `quarantine`, every break also quarantines the
    request's backend (kernel map update, its connections ended, audited).
    Reports, from the crossing instant (the deadline `begin` returned): to the client's
    cancel (`cancel()` returned: the RST_STREAM is with gRPC's transport), to the RST_STREAM
    frame leaving for the backend (with the kernel plane: the backend sits in a network
    namespace behind a veth pair whose host end the TC frame walker watches; its kernel
    timestamp), to the backend seeing the stream end (its CLOCK_MONOTONIC, the same clock),
    and to the quarantine map update; and how many were in flight when each was started.
    With `burst` > 1 the requests start in groups of that many, BURST_STEP apart (a slow
    backend's breaks come close together), the groups at the same average pace: a
    quarantine done between the crossings of a group would make its later cancels wait.
    The client starts its requests half a start (or half a group) off its crossings: paced
    at exactly budget / concurrency, request i + concurrency would start at request i's
    deadline, every crossing would fall inside one of the benchmark's own `future()` calls
    (which holds gRPC's channel lock, that a cancel needs too, and the interpreter; a
    normal-priority thread preempted there on a loaded machine holds both for milliseconds),
    and the figure would time the client rather than the guardian. `starts_at_crossings`
    keeps that alignment, reported beside the rest as the worst phase."""
    import json

    from policyc.enforcer.kernel_events import KernelEvent

    sys.path.insert(0, str(ROOT / "tests" / "evidence"))
    from netns_link import VethLink

    audit = _Tally()
    bundle = make_bundle(slo=slo, quarantine=Quarantine(duration=5, max_duration=10, max_share=1.0) if quarantine else None)
    g = Guardian(bundle, plane=plane, anomalies=_Sink(), audit=audit, executor=ActionExecutor(audit, rebalance=lambda n: None))
    backup = Endpoint.of("127.0.0.1", 9)
    link = VethLink("pcbrk") if plane.kernel_enforcement else None
    host = link.ns_ip if link else "127.0.0.1"
    enter = ["nsenter", f"--net=/run/netns/{link.ns}"] if link else []
    backend = subprocess.Popen([*enter, sys.executable, "-c", STALL, host], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert backend.stdin is not None and backend.stdout is not None
    server = Endpoint.of(host, int(backend.stdout.readline()))
    wire: dict[int, int] = {}  # stream id -> kernel ns at which its RST_STREAM left for the backend

    def on_event(ev: KernelEvent) -> None:
        if ev.b == server and ev.reset:
            wire[ev.stream_id] = ev.ts_ns
    unsubscribe = None
    if link:
        plane.attach_tc(link.host_if)  # before the connection opens: the frame walk starts at its SYN
        unsubscribe = plane.subscribe(on_event)
    channel = grpc.insecure_channel(str(server))
    try:
        call = stub(channel)
        grpc.channel_ready_future(channel).result(timeout=10)
        call(b"0", timeout=5)  # the connection is up before the first watched request
        budget = 0.925 * slo
        gap = budget / (concurrency if starts_at_crossings else concurrency + burst / 2)
        in_flight: list[int] = []
        deadlines: dict[str, float] = {}
        done = threading.Semaphore(0)
        backends = [Endpoint.of("10.250.0.1", 1000 + i) for i in range(n)]  # each request its own, so each break quarantines
        for be in backends:  # registered up front, as a fleet's are, not on the request path
            g.register_backend(be, backup)
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        for i, be in enumerate(backends):
            wait = t0 + (i - i % burst) * gap + (i % burst) * BURST_STEP - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            rid = f"r{i}"
            fut = call.future(b"1000", timeout=5, metadata=(("request-id", rid),))
            deadline = g.begin(rid, "fraud-scorer", fut, backend=be)
            assert deadline is not None
            deadlines[rid] = deadline
            in_flight.append(g.active())

            def ended(_: object, rid: str = rid) -> None:
                g.finish(rid)
                done.release()
            fut.add_done_callback(ended)
        for _ in range(n):
            done.acquire(timeout=10)
        deadline = time.monotonic() + 5
        while len(g.break_timings) < n and time.monotonic() < deadline:  # the accounts follow the cancels
            time.sleep(0.01)
        backend.stdin.write("\n")
        backend.stdin.flush()
        seen = json.loads(backend.stdout.readline())
        if link:
            plane.drain()
    finally:
        channel.close()
        backend.kill()
        backend.wait()
        if unsubscribe:
            unsubscribe()
        if link:
            plane.detach_tc(link.host_if)
            link.close()
    g.tick()
    cancel = [t.cancel_s * 1e6 for t in g.break_timings]
    rst = [(seen[rid] - at) * 1e6 for rid, at in deadlines.items() if rid in seen]
    # the warm-up call is the connection's stream 1; request i's is stream 3 + 2i, as a client
    # numbers its streams 1, 3, 5, ... in the order they start (one thread starts them here)
    on_wire = [(wire[sid] / 1e9 - deadlines[f"r{i}"]) * 1e6 for i in range(n) if (sid := 3 + 2 * i) in wire]
    maps = [t.map_update_s * 1e6 for t in g.break_timings if t.map_update_s is not None]
    where = "kernel map" if plane.kernel_enforcement else "user-space table (kernel enforcement off)"
    pattern = f"in groups of {burst} crossing {BURST_STEP * 1e6:.0f} us apart, " if burst > 1 else ""
    pattern += "new requests started at the crossings (worst phase), " if starts_at_crossings else ""
    print(f"break, {'with' if quarantine else 'without'} the quarantine action: n={len(cancel)}, {pattern}{concurrency} in flight "
          f"(median seen {statistics.median(in_flight):.0f}), budget {budget * 1e3:.0f} ms, load {load:.1f}: crossing->cancel "
          f"(client's cancel() returned) p50 {pct(cancel, 50):.0f} us  p99 {pct(cancel, 99):.0f} us  max {max(cancel):.0f} us "
          f"(floor: p99 <= 1000 us)")
    if on_wire:
        print(f"break: crossing->RST_STREAM on the wire to the backend (TC egress, kernel clock; {len(on_wire)} of {n}) "
              f"p50 {pct(on_wire, 50):.0f} us  p99 {pct(on_wire, 99):.0f} us")
    if rst:
        print(f"break: crossing->stream end seen by the backend process ({len(rst)} of {n}) p50 {pct(rst, 50):.0f} us  "
              f"p99 {pct(rst, 99):.0f} us")
    if maps:
        print(f"break: crossing->{where} update p50 {pct(maps, 50):.0f} us  p99 {pct(maps, 99):.0f} us")
    for be in list(plane.quarantined()):
        plane.release(be)
    g.close()


ECHO = textwrap.dedent("""
    import socket
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        d = c.recv(4096)
        if not d: break
        c.sendall(d)
""")


def bench_throughput(plane, seconds: float, rounds: int) -> None:  # type: ignore[no-untyped-def]
    from pyroute2.netns import popns, pushns

    ns = f"pc-bench-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    srv = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout is not None
        port = int(srv.stdout.readline())
        pushns(ns)
        try:
            c = socket.create_connection(("127.0.0.1", port))
        finally:
            popns()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = b"x" * 64

        def rate() -> float:
            n, end = 0, time.perf_counter() + seconds
            while time.perf_counter() < end:
                c.sendall(msg)
                c.recv(4096)
                n += 1
            return n / seconds

        rate()  # warm-up
        bare, attached = [], []
        for _ in range(rounds):
            bare.append(rate())
            plane.attach_tc("lo", ns)
            attached.append(rate())
            plane.detach_tc("lo", ns)
        b, a = statistics.median(bare), statistics.median(attached)
        print(f"throughput: 64 B request/response on lo: bare {b:,.0f}/s  kernel plane attached {a:,.0f}/s  ratio {a / b:.3f} (floor 0.9)")
        c.close()
    finally:
        srv.kill()
        subprocess.run(["ip", "netns", "del", ns], check=False)


def bench_self_heal(bundle) -> None:  # type: ignore[no-untyped-def]
    from policyc.placer.simulator import SimulatedCluster

    sim = SimulatedCluster(7, 4, gpus_per_host=4)
    slots = sim.gpu_slots()
    victim = f"{slots[5].host}/{slots[5].gpu}"
    audit = MemoryAudit()
    done: dict[str, float] = {}
    rebalanced_at: list[int] = []

    def rebalance(node: str) -> None:
        sim.clear(victim)  # the node's instances move away: the pinned collapse ends
        rebalanced_at.append(sim.tick)
        done["wall"] = time.perf_counter()

    g = Guardian(bundle, plane=_quiet_plane(audit), anomalies=_Sink(), audit=audit, executor=ActionExecutor(audit, rebalance=rebalance))
    sim.sm_collapse(victim, 0.15)
    first_tick = None
    t0 = 0.0
    for _ in range(40):
        frame = sim.sample()
        for i, s in enumerate(slots):
            sig = {"sm_utilization": float(frame.gpu_sm_util[i]), "tls_handshake": 0.01}
            key = f"{s.host}/{s.gpu}"
            if key == victim and first_tick is None and sig["sm_utilization"] < 0.2:
                first_tick, t0 = frame.tick, time.perf_counter()
            g.observe_gpu(key, sig)
        if rebalanced_at:
            break
    g.close()
    if not rebalanced_at or first_tick is None:
        print("self-heal: no rebalance within 40 ticks")
        return
    ticks = rebalanced_at[0] - first_tick + 1
    print(f"self-heal: first anomaly -> rebalanced placement: {ticks} ticks = {ticks * TICK_S:.1f} s at {TICK_S * 1e3:.0f} ms/tick "
          f"(guardian processing {1e3 * (done['wall'] - t0):.1f} ms wall); reference 8.7 s, by hand 3.2 min")


def bench_gpu_watch(bundle, ticks: int) -> None:  # type: ignore[no-untyped-def]
    """Alternating ticks of the two ways of observing every busy GPU, each on its own
    guardian (same rules), over the same frames."""
    from policyc.placer import SimulatedCluster
    from policyc.placer.snapshot import COLLAPSE_MIN_DEMAND

    sim = SimulatedCluster(1, 256, 8, hosts_per_rack=8)
    t = sim.topology()
    sim.sm_collapse(t.gpu_key(5), 0.15)
    guardians = [Guardian(bundle, plane=_quiet_plane(MemoryAudit()), anomalies=_Sink(), audit=MemoryAudit(),
                          executor=ActionExecutor(MemoryAudit(), rebalance=lambda _: None)) for _ in range(2)]
    each: list[float] = []
    batch: list[float] = []
    busy_n: list[int] = []
    for _ in range(ticks):
        frame = sim.sample()
        busy = [int(i) for i in (frame.gpu_demand >= COLLAPSE_MIN_DEMAND).nonzero()[0]]
        busy_n.append(len(busy))
        keys = [t.gpu_key(i) for i in busy]
        sm = frame.gpu_sm_util[busy]
        a = time.perf_counter()
        for k, v in zip(keys, sm.tolist()):
            guardians[0].observe_gpu(k, {"sm_utilization": v})
        b = time.perf_counter()
        guardians[1].observe_gpus(keys, "sm_utilization", sm)
        c = time.perf_counter()
        each.append(b - a)
        batch.append(c - b)
    for g in guardians:
        g.close()
    e, w = statistics.median(each) * 1e3, statistics.median(batch) * 1e3
    print(f"GPU watch, {len(t.gpus)} GPUs ({statistics.median(busy_n):.0f} busy), per tick: observe_gpus {w:.2f} ms, "
          f"observe_gpu per GPU (baseline) {e:.2f} ms -> ratio {e / w:.1f}x")


GATEWAY_BACKUPS = 3  # backup-model servers (the callers' model), each on a GPU of its own: no refusal up to 16 callers (measured)
GATEWAY_CONCURRENCY = (1, 16)  # one caller (latency-bound) and enough to keep both CPUs busy (CPU-bound, measured)
_REQUESTS = "http.policyc_gateway.downstream_rq_total"


def _gateway_bench_module():  # type: ignore[no-untyped-def]
    """benchmarks/gateway.py (its h2load round and /proc CPU reader), loaded once."""
    import importlib.util

    mod = sys.modules.get("policyc_bench_gateway")
    if mod is None:
        spec = importlib.util.spec_from_file_location("policyc_bench_gateway", ROOT / "benchmarks" / "gateway.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["policyc_bench_gateway"] = mod
        spec.loader.exec_module(mod)
    return mod


class _RigCpu:
    """CPU seconds (user + system, /proc/PID/stat) of every process of one gateway rig: its
    Envoy, its model servers, its audit log's writer process (with an audit log) and the
    policyc process (the decision service, the picker, the access-log receiver and the audit
    bridge: this benchmark's own process, shared by the rigs it holds, so its idle spending
    is measured with them all up and subtracted). The kernel plane's programs run in the
    sending process's context and land in those figures (system time)."""

    def __init__(self, rig) -> None:  # type: ignore[no-untyped-def]
        self.rig = rig
        audit = rig.thread.server.audit
        self.groups: dict[str, list[int]] = {
            "Envoy": [rig.gateway.envoy.pid],
            "model servers": [p.pid for p in rig.models.processes if p.pid is not None],
            "policyc process": [os.getpid()],
        }
        if audit is not None:
            self.groups["audit writer"] = [audit.log._proc.pid]
        self.idle: dict[str, float] = dict.fromkeys(self.groups, 0.0)  # CPU s per second with no load

    def sample(self) -> dict[str, float]:
        cpu = _gateway_bench_module()._cpu_s
        return {g: sum(cpu(p) for p in pids) for g, pids in self.groups.items()}

    def requests(self) -> int:
        """Requests this rig's Envoy has taken (h2load's warm-up included: what the CPU was spent on)."""
        return self.rig.gateway.envoy.stats(_REQUESTS).get(_REQUESTS, 0)


def _measure_idle(cpus: list[_RigCpu], seconds: float = 2.0) -> None:
    t0, before = time.perf_counter(), [c.sample() for c in cpus]
    time.sleep(seconds)
    wall = time.perf_counter() - t0
    for c, b in zip(cpus, before):
        c.idle = {g: (v - b[g]) / wall for g, v in c.sample().items()}


@dataclass
class _GatewayRound:
    mode: str
    answered: int  # calls the model servers answered in h2load's measured phase
    seconds: float  # that phase
    errors: int  # failures + the picker's refusals
    served: int  # requests Envoy took in the whole round (warm-up too)
    cpu: dict[str, float]  # CPU s per process group in the whole round, net of idle; "client": h2load's
    wall: float

    @property
    def rate(self) -> float:
        return self.answered / self.seconds

    def per_call(self, group: str | None = None) -> float:
        """CPU seconds per call Envoy took (one group, or every process of the rig and the client)."""
        total = self.cpu.get(group, 0.0) if group is not None else sum(self.cpu.values())
        return total / max(self.served, 1)


_H2LOAD_WORK: list[Path] = []


def _h2load_work() -> Path:
    """One folder for every round's h2load log and the request it sends (a gRPC frame of
    MODEL's 4-token request), made on first use."""
    if not _H2LOAD_WORK:
        import tempfile

        from policyc.modelserver.client import infer_request, token_ids

        work = Path(tempfile.mkdtemp(prefix="policyc-bench-h2-"))
        message = infer_request(MODEL, token_ids(4)).SerializeToString()
        (work / "request.grpc").write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)
        _H2LOAD_WORK.append(work)
    return _H2LOAD_WORK[0]


def _gateway_round(rig, cpu: _RigCpu, mode: str, concurrency: int, seconds: float) -> _GatewayRound:  # type: ignore[no-untyped-def]
    """One closed-loop round through the gateway with nghttp2's h2load (benchmarks/gateway.py's
    round: one HTTP/2 connection, `concurrency` streams, after a 0.5 s warm-up), with the CPU
    every process of the rig spent on it."""
    gw = _gateway_bench_module()
    work = _h2load_work()
    body = work / "request.grpc"
    counts = rig.gateway.picker.picker.counts
    refused = sum(n for what, n in counts.items() if what not in ("forwarded", "broken"))
    q0 = cpu.requests()
    t0, c0 = time.perf_counter(), cpu.sample()
    lat, failed, elapsed, client = gw._h2load_round(rig.listen, MODEL, concurrency, seconds, body, work)
    c1, wall = cpu.sample(), time.perf_counter() - t0
    served = cpu.requests() - q0
    refused = sum(n for what, n in counts.items() if what not in ("forwarded", "broken")) - refused
    spent = {g: c1[g] - c0[g] - cpu.idle[g] * wall for g in c0}
    spent["client"] = client
    return _GatewayRound(mode, len(lat) - refused, elapsed, failed + refused, served, spent, wall)


def _alternate(a: str, b: str, rounds: int) -> list[str]:
    """a b b a a b b a ...: each mode as often first as second, `rounds` of each."""
    return [(a, b)[i % 2] if i % 4 < 2 else (b, a)[i % 2] for i in range(rounds * 2)]


def _spread(xs: list[float], fmt: str = ".0f") -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def _report_pairs(what: str, a: str, b: str, rs: list[_GatewayRound], concurrency: int, floor: float) -> float:
    """Print one comparison and return its figure: the median over adjacent rounds (each `a`
    round with the `b` round run next to it, a b b a ...) of their throughput ratio. Pairing
    cancels what drifts between rounds (the machine's other load, a slow stretch of the model
    servers), which moves a ratio of the two modes' median rates by ±0.1 from run to run; every
    pair counts, none is dropped. Beside it: the ratio of the median rates, the CPU per call
    (every process of the rig and the client) and, per process, the median over pairs of the
    CPU per call `a` adds, which says where a difference comes from."""
    ra, rb = [r for r in rs if r.mode == a], [r for r in rs if r.mode == b]
    medians = statistics.median(r.rate for r in ra) / statistics.median(r.rate for r in rb)
    adjacent = [(x, y) if x.mode == a else (y, x) for x, y in zip(rs[::2], rs[1::2])]  # each a round with its b round
    pairs = [x.rate / y.rate for x, y in adjacent]
    ratio = statistics.median(pairs)
    cpu_pairs = [x.per_call() / y.per_call() for x, y in adjacent]
    groups = list(dict.fromkeys(g for r in ra + rb for g in r.cpu))
    added = {g: statistics.median(x.per_call(g) - y.per_call(g) for x, y in adjacent) for g in groups}

    def cpu_line(rounds: list[_GatewayRound]) -> str:
        per = {g: statistics.median(r.per_call(g) for r in rounds) for g in groups}
        return (f"{statistics.median(r.per_call() for r in rounds) * 1e6:.0f} us ("
                + ", ".join(f"{g} {v * 1e6:.0f}" for g, v in per.items()) + ")")

    ca, cb = statistics.median(r.per_call() for r in ra), statistics.median(r.per_call() for r in rb)
    busy = statistics.median(sum(r.cpu.values()) / r.wall for r in rs)
    print(f"  concurrency {concurrency:>2}: {a} {_spread([r.rate for r in ra])} calls/s, {b} "
          f"{_spread([r.rate for r in rb])} calls/s ({len(ra)} rounds each, {sum(r.errors for r in rs)} errors)")
    print(f"  concurrency {concurrency:>2}: CPU per call, every process of the rig and the client: {a} {cpu_line(ra)}; "
          f"{b} {cpu_line(rb)} -> {(ca - cb) * 1e6:+.0f} us ({ca / cb:.3f}x; adjacent rounds {_spread(cpu_pairs, '.3f')}); "
          f"rig busy {busy:.2f} of {os.cpu_count()} CPUs")
    print(f"  concurrency {concurrency:>2}: CPU per call {a} adds, median of {len(adjacent)} adjacent pairs: "
          + ", ".join(f"{g} {v * 1e6:+.0f} us" for g, v in added.items()))
    print(f"gateway throughput, {what}, concurrency {concurrency}: {ratio:.3f}x (median of {len(pairs)} adjacent pairs "
          f"{_spread(pairs, '.3f')}; median rates {medians:.3f}x; floor {floor}); CPU per call {ca / cb:.3f}x "
          f"(adjacent pairs {statistics.median(cpu_pairs):.3f}x); load average {os.getloadavg()[0]:.2f}")
    return ratio


def bench_gateway(seconds: float, rounds: int, concurrency: tuple[int, ...] = GATEWAY_CONCURRENCY, *, kernel: bool = True,
                  audit_rounds: int | None = None) -> None:
    """Through real Envoy (`policyc gateway`'s runner) to real KServe model servers:
    (a) the kernel plane attached to the data path (TC on lo, connect hooks on Envoy's cgroup)
    vs detached, alternating in one gateway (floor >= 0.93x); (b) the audit log with per-call
    accounting from Envoy's access log vs no audit log, two gateways side by side, rounds
    alternating (floor >= 0.9x, 0 accounting records dropped). Each at one caller in a
    closed loop (latency-bound: calls/s moves with the machine's other load) and at enough
    callers to keep the CPUs busy (CPU-bound: the throughput ratio is the CPU ratio), short
    rounds alternating a b b a, with every rig process's CPU per call beside the calls/s:
    CPU per call moves far less with load, so it says where a throughput ratio comes from.
    The callers' model is served by GATEWAY_BACKUPS servers, so placement has the GPU share
    for all of them and the picker never refuses (a refusal is counted as an error).
    Each comparison's figure is the median of its adjacent rounds' ratios (`_report_pairs`).
    `kernel=False` runs (b) alone; `audit_rounds`: (b)'s rounds per mode (default `rounds`):
    more, shorter rounds pair better."""
    sys.path.insert(0, str(ROOT / "tests" / "gateway"))
    sys.path.insert(0, str(ROOT / "tests" / "evidence"))
    from policyc.compiler.pipeline import compile_paths

    bundle = compile_paths([str(ROOT / "policies")], analyse=False).bundle
    assert bundle is not None
    print(f"gateway: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {rounds} rounds of {seconds:g} s "
          f"(+0.5 s warm-up) per mode and concurrency; model {MODEL} on {GATEWAY_BACKUPS} model servers")
    if kernel:
        _gateway_kernel(bundle, seconds, rounds, concurrency)
    _gateway_audit(bundle, seconds, rounds if audit_rounds is None else audit_rounds, concurrency)


def _gateway_kernel(bundle, seconds: float, rounds: int, concurrency: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    """`bench_gateway`'s (a): the kernel plane attached vs detached in one gateway."""
    import tempfile

    from evidence_support import EvidenceRig

    from policyc.server.config import EnforcerMode

    rig = EvidenceRig(bundle, Path(tempfile.mkdtemp(prefix="policyc-bench-kgw-")), enforcer=EnforcerMode.KERNEL, audit=False,
                      backups=GATEWAY_BACKUPS)
    try:
        cpu = _RigCpu(rig)
        _measure_idle([cpu])
        for conc in concurrency:
            rs = []
            for mode in _alternate("attached", "detached", rounds):
                dp = rig.gateway.data_path
                if mode == "detached" and dp is not None:
                    dp.detach()
                    rig.gateway.data_path = None
                elif mode == "attached" and dp is None:
                    rig.gateway._attach_data_path()
                rs.append(_gateway_round(rig, cpu, mode, conc, seconds))
            _report_pairs("kernel plane attached / detached", "attached", "detached", rs, conc, 0.93)
    finally:
        rig.stop()


def _gateway_audit(bundle, seconds: float, rounds: int, concurrency: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    """`bench_gateway`'s (b): audit + per-call accounting on vs off, two gateways side by side."""
    import tempfile

    from evidence_support import EvidenceRig

    print(f"gateway audit on/off: {rounds} rounds of {seconds:g} s (+0.5 s warm-up) per mode and concurrency")
    on = EvidenceRig(bundle, Path(tempfile.mkdtemp(prefix="policyc-bench-aon-")), backups=GATEWAY_BACKUPS)
    off = EvidenceRig(bundle, Path(tempfile.mkdtemp(prefix="policyc-bench-aoff-")), audit=False, backups=GATEWAY_BACKUPS)
    try:
        cpus = {"on": _RigCpu(on), "off": _RigCpu(off)}
        _measure_idle(list(cpus.values()))
        print(f"  idle, subtracted: policyc process (both rigs) {cpus['on'].idle['policyc process'] * 1e3:.0f} ms CPU/s, "
              f"audit writer {cpus['on'].idle['audit writer'] * 1e3:.1f} ms CPU/s")
        for conc in concurrency:
            rs = []
            for mode in _alternate("on", "off", rounds):
                rs.append(_gateway_round(on if mode == "on" else off, cpus[mode], mode, conc, seconds))
            _report_pairs("audit + accounting on / off", "on", "off", rs, conc, 0.9)
        on.gateway._settle_access_log()
        time.sleep(1.5)  # the receiver's grace for the last calls
        receiver = on.gateway.access_log.receiver  # type: ignore[union-attr]
        c = receiver.counts
        print(f"gateway accounting: {cpus['on'].requests()} calls taken by the audited rig's Envoy (warm-ups included), "
              f"{c.calls} calls logged by Envoy with their decision id and {c.unpicked} without one (streams ended before a "
              f"pick: h2load cuts its streams at a round's end), {c.recorded} records, {c.dropped} dropped, {c.incomplete} incomplete, "
              f"{receiver.pending()} pending; audit log failures {on.thread.server.audit.failures}")  # type: ignore[union-attr]
    finally:
        on.stop()
        off.stop()


def _quiet_plane(audit: MemoryAudit):  # type: ignore[no-untyped-def]
    from policyc.enforcer.userspace_plane import KernelEnforcementOff, UserSpacePlane

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelEnforcementOff)
        return UserSpacePlane(audit, reason="simulator")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and shorter phases")
    args = ap.parse_args()
    plane = open_plane(_Tally())  # the budget section's plane: its kernel records are counted, not kept
    print(f"kernel enforcement: {'on' if plane.kernel_enforcement else 'OFF'}")
    for burst in (1, 10):
        for quarantine in (True, False):
            bench_break(plane, 200 if args.quick else 1000, quarantine=quarantine, burst=burst)
    bench_break(plane, 200 if args.quick else 1000, quarantine=True, burst=10, starts_at_crossings=True)
    if plane.kernel_enforcement:
        bench_throughput(plane, 0.5 if args.quick else 2.0, 2 if args.quick else 3)
    else:
        print("throughput: skipped, the kernel plane needs root and BPF")
    from policyc.compiler.pipeline import compile_paths

    policies = compile_paths(sorted((ROOT / "policies").glob("*.contract")), analyse=False).bundle
    bench_self_heal(policies)
    bench_gpu_watch(policies, 10 if args.quick else 40)
    kernel = plane.kernel_enforcement
    plane.close()
    if kernel:
        bench_gateway(1.0 if args.quick else 1.5, 2 if args.quick else 6)
    else:
        print("gateway: skipped, the kernel plane needs root and BPF")


if __name__ == "__main__":
    main()
