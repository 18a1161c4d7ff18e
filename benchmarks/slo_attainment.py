"""SLO attainment per router: the same emulated model servers, the same request trace, one
router at a time, in one run.

    scripts/bench_setup.sh                      # the peers: vllm-router, sglang-router in .venv-routers
    .venv/bin/python benchmarks/slo_attainment.py --instances 32 --rate 12 --duration 20
    .venv/bin/python benchmarks/slo_attainment.py --quick   # 8 instances, 8 s a router

Routers: policyc's gateway (`policyc gateway`, its placer scraping the servers' `/metrics`);
Envoy round robin and least request (a plain Envoy bootstrap, the same binary the gateway
runs); `vllm-router` (round_robin, power_of_two, cache_aware) and `sglang-router`
(cache_aware) from `.venv-routers` (a router whose binary is missing is reported as not run,
never dropped silently).

The pool: `--instances` vLLM-compatible emulators (`modelserver/emulator.py`, vLLM's routes
and `vllm:*` metrics), four to a process, restarted for every router (empty queues,
empty prefix caches). Each is registered with policyc on a GPU of the simulated cluster that
admits the model; half on H100s, a quarter on A100-80Gs and a quarter on L4s, each emulator
slowed by its class's bf16 peak against the H100's (`--base-slowdown` for the H100), so the
pool is heterogeneous in fact as well as in declaration. `max_num_seqs` is kept small
(`--max-seqs`) so requests queue at a busy server, as at a loaded vLLM.

The trace (`--trace FILE` to reuse one; written beside the results): Poisson arrivals at
`--rate` for `--duration` seconds; three tenants with TTFT SLOs sent as `x-slo-ttft-ms`
(gold 300 ms 20 %, silver 1000 ms 50 %, bronze 4000 ms 30 %); 70 % of requests open with
one of 8 shared system prompts (prefix groups, like the anchors' "b2b-saas" workload scaled
down); 70 % short questions, 30 % long documents; 16 to 64 output tokens; streamed chat.

policyc's bundle is `policies` with the model's contract from `policies/llm`, its TPOT bound
raised from 50 ms (set for real vLLM on this CPU) to 2 s: the slowed emulators' steps are
longer than 50 ms, and policyc's gateway ends a stream that breaks its contract's TPOT,
which no peer does. Its per-token prefill cost (`llm.prefill`) is the emulated model's
(`--contract-prefill emulator`, the default): the emulator's prefill seconds per token on an
H100-class emulator (its timing model's `prefill_s_per_token` x `--base-slowdown`) times the
H100's bf16 rate at the contract's efficiency, so that the contract declares the cost of the
model this pool serves, as an operator declares a real model's; `model` keeps the tiny
model's own 1.9 MFLOP (which predicts microseconds on every class: the pool then looks
homogeneous to the contract). The peers read no contract either way.

`--classes` sets the pool's class shares (default half H100, a quarter A100-80G, a quarter
L4; `H100:0.25,A100-80G:0.25,L4:0.5` is the more heterogeneous pool), `--rates` runs several
load levels in one run (one trace per rate, the same seed). `--policyc-scrape-interval` passes
the gateway a scrape tick other than its default 50 ms (a diagnosis: 32 emulators' `/metrics`
answered every 50 ms share this machine's CPU with their token loops, a cost only the scraping
router's runs pay; benchmarks/RESULTS.md). The TTFT SLOs are the tenants' headers, which policyc's gateway holds
each streamed attempt to (a first token later than its SLO is cut and retried once on the
backup model, `tiny-llm-lite`, which this pool does not serve: a miss either way).

The load: inference-perf (`--client inference-perf`, the default; the Inference Extension's
load generator, in `.venv-perf`, made by `scripts/bench_setup.sh`) replays the trace file:
each request at its arrival offset (its `trace_replay` load), with the trace's own messages,
`max_tokens` and `x-slo-ttft-ms` header (a data source of ours through its `DataGenerator`
interface, `benchmarks/inference_perf_replay.py`: its own file sources send one header set
per run), its TTFT the first content token as it measures it; the outcomes are read from its
per-request lifecycle records. `--client builtin` replays the same trace with a small
asyncio client here (aiohttp; the first streamed content token's arrival its TTFT), which
needs no Python 3.12 venv.

Per router: SLO attainment (the share of all requests answered 200 with TTFT within their
SLO; refused and failed requests count as missed), goodput (requests per second that met
their SLO), TTFT p50/p90/p99 of the answered, output tokens per second, the refusals
with their reasons (policyc's `x-policyc-reason`), and the router's own processes' CPU
during the trace: seconds on a core (`router_cpu_s`, and by process name in
`router_cpu_by_process_s`) and seconds its threads were runnable
but queued for one (`router_cpu_wait_s`, the kernel's schedstat), which on this 2-core
machine with real vLLM engines holding both cores is where a router with more process hops
per request loses time. `answers_whole`: how many streamed answers reached the client whole,
more than half of their chunks within 5 ms of the first (`arrived_whole`): their first token
held back with the rest, at the model server or on the way (benchmarks/RESULTS.md, "where
the first tokens go on 2 real vLLM"). With real vLLM, `servers_cpu_and_wait_s`: the same two
figures for the model servers' processes by name (the API servers, `VLLM::EngineCore`) during
the router's trace, to say whose cost the servers' waits for a core are.

`--router-nice N` (root): every router's processes, as a group per session, get the weight of
nice N against the model servers (`prioritise`: the autogroup nice; a plain nice does nothing
between sessions). Real vLLM on the CPU holds every core of this machine with its engines, a
condition no GPU deployment has (there the engines run on the accelerators and the router has
cores of its own); with it each router, peers and policyc alike, gets a core when it wakes.
The figures with and without it are both in benchmarks/RESULTS.md.

`--router-core C` (real vLLM): the routers and the load generator run on core C alone and the
model servers on the others, the layout of a GPU host, where the engines never take the
router's core. On this 2-core machine the two servers then share one core, and the fleet given
to policyc says so: servers bound to the same cores are declared copies of the model on one
GPU (`on_their_devices`), as an operator declares two engines sharing an accelerator (without
`--router-core` each server is bound to a core of its own and declared a GPU of its own). The
peers are given the two endpoints; none takes a declaration of where they run. With real vLLM each
load level's trace is first replayed once through Envoy round robin, not measured
(`warm_servers`), and each router's result carries the servers' own mean TTFT from their
histograms (`server_ttft_mean_ms`): the client's TTFT less it is the router's part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-llm"
ROUTERS_VENV = REPO / ".venv-routers"
TPOT_LINE = "tpot: <= 50 ms"  # the contract's, for real vLLM on CPU; the slowed pool's is 2 s (see the docstring)
PREFILL_LINE = "prefill: 1.9e6 FLOP"  # the tiny model's; the emulated model's is declared instead (see the docstring)
ALL_ROUTERS = ("policyc", "envoy-round-robin", "envoy-least-request", "vllm-router:round_robin",
               "vllm-router:power_of_two", "vllm-router:cache_aware", "sglang-router:cache_aware")
TENANTS = (("gold", 300, 0.2), ("silver", 1000, 0.5), ("bronze", 4000, 0.3))
CLASSES = (("H100", 0.5), ("A100-80G", 0.25), ("L4", 0.25))


@dataclass(frozen=True)
class Scenario:
    """A trace's tenants (name, TTFT SLO ms, share), each tenant's share of long prompts, and
    the pool's default class shares."""

    tenants: tuple[tuple[str, int, float], ...]
    long_share: dict[str, float]
    classes: tuple[tuple[str, float], ...]


SCENARIOS = {
    # the trace of every earlier run: three tenants, 30 % long prompts each; half H100
    "mixed": Scenario(TENANTS, {"gold": 0.3, "silver": 0.3, "bronze": 0.3}, CLASSES),
    # a heterogeneous pool where the class decides the SLO: a quarter H100, half A100-80G (3.2x
    # slower by the catalog's bf16 peaks, as every run slows them), a quarter L4 (8.2x); an
    # interactive gold tenant (40 %) with a 150 ms TTFT SLO whose prompts are mostly long
    # documents (RAG-like, 60 %: ~600 tokens, ~60 ms on an idle H100-class emulator, ~175 ms on
    # an A100-class one, ~450 ms on an L4); silver and bronze as in `mixed`
    "hetero": Scenario((("gold", 150, 0.4), ("silver", 1000, 0.3), ("bronze", 4000, 0.3)),
                       {"gold": 0.6, "silver": 0.3, "bronze": 0.3}, (("H100", 0.25), ("A100-80G", 0.5), ("L4", 0.25))),
}
WORDS = ("the of and to in is that for it as with on be by this are from at or an account invoice customer "
         "contract renewal payment usage report tenant region latency error").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------- the trace
@dataclass(frozen=True)
class Entry:
    at: float  # seconds from the start
    tenant: str
    slo_ms: int
    group: int  # prefix group, -1: none
    long: bool
    prompt: str
    system: str
    max_tokens: int


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def make_trace(seed: int, rate: float, duration: float, scenario: Scenario = SCENARIOS["mixed"]) -> list[Entry]:
    rng = random.Random(seed)
    tenants = scenario.tenants
    systems = [f"You are the support assistant of company {g}. " + _text(random.Random(seed * 100 + g), 600) for g in range(8)]
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        r = rng.random()
        tenant, slo, _ = next(x for x, c in zip(tenants, _cumulative([w for _, _, w in tenants])) if r < c)
        group = rng.randrange(8) if rng.random() < 0.7 else -1
        long = rng.random() < scenario.long_share[tenant]
        prompt = _text(rng, rng.randint(1200, 2000) if long else rng.randint(60, 240))
        out.append(Entry(round(t, 4), tenant, slo, group, long, prompt, systems[group] if group >= 0 else "",
                         rng.randint(16, 64)))


def _cumulative(ws: list[float]) -> list[float]:
    acc, out = 0.0, []
    for w in ws:
        acc += w
        out.append(acc)
    out[-1] = 1.0
    return out


# ---------------------------------------------------------------------- the pool
EMULATORS = """
import json, sys, time
from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec
from policyc.modelserver.emulator_engine import TimingModel
specs = json.loads(sys.argv[1])
srv = EmulatorServer([EmulatorSpec(s["model"], timing=TimingModel(max_num_seqs=s["max_seqs"]), slowdown=s["slowdown"])
                      for s in specs]).start()
print(json.dumps(srv.endpoints), flush=True)
time.sleep(86400)
"""


@dataclass(frozen=True)
class Slot:
    instance_id: str
    gpu_model: str
    slowdown: float
    deployment: dict[str, Any]


def emulated_prefill_flops(base_slowdown: float, efficiency: float = 0.30) -> float:
    """The emulated model's prefill FLOPs per token: the H100 emulator's prefill seconds per
    token times the H100's bf16 rate at the contract's efficiency (see the docstring)."""
    from policyc.modelserver.emulator_engine import TimingModel
    from policyc.placer.catalog import catalog_by_name

    peak = dict(catalog_by_name()["H100"].peak_flops)["bf16"]
    return TimingModel().prefill_s_per_token * base_slowdown * peak * efficiency


def parse_classes(text: str) -> tuple[tuple[str, float], ...]:
    """`H100:0.5,A100-80G:0.25,L4:0.25` -> the pool's class shares (they must sum to 1)."""
    out = []
    for part in text.split(","):
        name, _, share = part.partition(":")
        try:
            out.append((name.strip(), float(share)))
        except ValueError:
            raise SystemExit(f"slo_attainment: --classes `{part}`: expected CLASS:SHARE") from None
    if not out or abs(sum(w for _, w in out) - 1.0) > 1e-6 or any(w <= 0 for _, w in out):
        raise SystemExit(f"slo_attainment: --classes {text!r}: positive shares summing to 1")
    return tuple(out)


def pool_slots(n: int, base_slowdown: float, classes: tuple[tuple[str, float], ...] = CLASSES,
               contract_prefill: str = "emulator") -> tuple[list[Slot], Any]:
    """`n` GPUs of the simulated cluster that admit the model, by class share, each with
    its emulator's slowdown (the class's bf16 peak against the H100's)."""
    sys.path.insert(0, str(REPO / "tests" / "gateway"))
    sys.path.insert(0, str(REPO / "tests"))
    from llm_rig import llm_bundle

    from policyc.placer import SimulatedCluster
    from policyc.placer.catalog import catalog_by_name, catalog_for
    from policyc.server.config import ClusterSpec
    from policyc.server.fleet import admissible_fleet

    contracts = Path(tempfile.mkdtemp(prefix="policyc-slo-contract-"))
    text = (REPO / "policies" / "llm" / "tiny-llm.contract").read_text()
    if TPOT_LINE not in text:
        raise SystemExit(f"slo_attainment: policies/llm/tiny-llm.contract no longer declares `{TPOT_LINE}`")
    text = text.replace(TPOT_LINE, "tpot: <= 2 s")
    if contract_prefill == "emulator":
        if PREFILL_LINE not in text:
            raise SystemExit(f"slo_attainment: policies/llm/tiny-llm.contract no longer declares `{PREFILL_LINE}`")
        text = text.replace(PREFILL_LINE, f"prefill: {emulated_prefill_flops(base_slowdown):.4g} FLOP", 1)
    (contracts / "tiny-llm.contract").write_text(text)
    bundle = llm_bundle((contracts,))
    c = ClusterSpec()
    slots = SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack).gpu_slots()
    fleet = admissible_fleet(bundle, slots, models=[MODEL])
    peaks = {name: dict(g.peak_flops)["bf16"] for name, g in catalog_by_name(catalog_for(bundle.gpu_catalog)).items()}
    out: list[Slot] = []
    for cls, share in classes:
        want = max(1, round(n * share)) if cls != classes[-1][0] else n - len(out)
        of = [i for i in fleet if i.deployment.gpu_model == cls][:want]
        if len(of) < want:
            raise SystemExit(f"slo_attainment: the simulated cluster has {len(of)} {cls} GPUs admitting {MODEL}, {want} wanted")
        out += [Slot(i.id, cls, base_slowdown * peaks["H100"] / peaks[cls], i.deployment.model_dump()) for i in of]
    return out, bundle


def on_their_devices(slots: list[Slot], devices: list[str]) -> list[Slot]:
    """`slots` declared where the servers run: a server whose device (`devices[i]`, the cores
    it is bound to) an earlier server already runs on is a copy of the model on that server's
    GPU (the same host and GPU, an id of its own); the others keep their own GPU. Two engines on
    one device share its compute: declared as two GPUs, a placer would spread requests across
    them as if each had its own (benchmarks/RESULTS.md, "two engines on one core")."""
    first: dict[str, Slot] = {}
    out: list[Slot] = []
    for i, (s, d) in enumerate(zip(slots, devices)):
        on = first.setdefault(d, s)
        out.append(s if on is s else Slot(f"{on.instance_id}#{i}", on.gpu_model, on.slowdown, on.deployment))
    return out


class Pool:
    """The emulators, `per_process` to a process (each process is one Python event loop, so
    a few servers each keep their own timing, and /metrics scrapes, from queueing behind the
    others')."""

    def __init__(self, slots: list[Slot], max_seqs: int, per_process: int = 4) -> None:
        specs = [{"model": MODEL, "max_seqs": max_seqs, "slowdown": s.slowdown} for s in slots]
        self.procs = [subprocess.Popen([sys.executable, "-c", EMULATORS, json.dumps(specs[i:i + per_process])],
                                       stdout=subprocess.PIPE, text=True, start_new_session=True)
                      for i in range(0, len(specs), per_process)]
        self.endpoints: list[str] = []
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                self.stop()
                raise SystemExit("slo_attainment: the emulators did not start")
            self.endpoints += json.loads(line)

    def totals(self) -> list[tuple[float, float, float]]:
        """Per server, in pool order, from its own metrics: the requests it finished
        (`vllm:request_success_total`) and its TTFT histogram's sum and count
        (`vllm:time_to_first_token_seconds`: the first token as the server saw it)."""
        import urllib.request

        out: list[tuple[float, float, float]] = []
        for e in self.endpoints:
            with urllib.request.urlopen(f"http://{e}/metrics", timeout=10) as r:
                text = r.read().decode()
            done, ttft_sum, ttft_count = (sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                                  if line.startswith(name)) for name in SERVER_SERIES)
            out.append((done, ttft_sum, ttft_count))
        return out

    def served(self) -> list[float]:
        """Requests each server finished, in pool order."""
        return [t[0] for t in self.totals()]

    def server_ttft_ms(self) -> float | None:
        """The servers' own mean TTFT over the requests they finished (None: no histogram)."""
        return _mean_ttft_ms(self.totals())

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)


SERVER_SERIES = ("vllm:request_success_total{", "vllm:time_to_first_token_seconds_sum{",
                 "vllm:time_to_first_token_seconds_count{")


def _mean_ttft_ms(totals: list[tuple[float, float, float]]) -> float | None:
    count = sum(t[2] for t in totals)
    return round(1e3 * sum(t[1] for t in totals) / count, 1) if count > 0 else None


class RealPool:
    """`n` real vLLM servers (`.venv-vllm`, the project's tiny model served under MODEL), one
    per core, started once for the whole run (about 70-150 s here) and shared by every router
    in turn: before each router their prefix caches are emptied (vLLM's dev-mode
    `POST /reset_prefix_cache`, so no router inherits another's cache) and `served` counts
    from that moment (`vllm:request_success_total` is cumulative)."""

    def __init__(self, n: int, workdir: Path) -> None:
        from policyc.modelserver.llm_model import cached_llm_model
        from policyc.modelserver.vllm_engine import VllmServer, VllmSpec

        os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # vLLM's /reset_prefix_cache route (its env copies ours)
        model = cached_llm_model()
        cores = sorted(os.sched_getaffinity(0))
        self.devices = [str(cores[i % len(cores)]) for i in range(n)]  # the cores each server is bound to: its device
        self.servers = [VllmServer(VllmSpec(model.dir, MODEL, cpu_bind=d), workdir / f"vllm-{i}") for i, d in enumerate(self.devices)]
        try:
            for srv in self.servers:
                srv.spawn()
            for srv in self.servers:
                srv.wait_ready()
        except Exception:
            self.close()
            raise
        self.endpoints = [srv.endpoint for srv in self.servers]
        self._base: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * n
        asyncio.run(self._warm())

    async def _warm(self, each: int = 24) -> None:
        """Requests of the trace's shapes straight to every server before any router: a fresh
        vLLM's first requests are slow (its first forward passes of each shape), and the
        router that came first would pay for it (and its lifetime TTFT histogram keep it)."""
        import aiohttp

        rng = random.Random(7)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def one(endpoint: str, body: dict[str, Any]) -> None:
                async with session.post(f"http://{endpoint}/v1/chat/completions", json=body) as r:
                    await r.read()

            for e in self.endpoints:
                for _ in range(0, each, 4):
                    await asyncio.gather(*(one(e, {"model": MODEL, "max_tokens": 16, "messages": [
                        {"role": "user", "content": _text(rng, rng.choice((100, 600, 1500, 2000)))}]}) for _ in range(4)))

    def fresh(self) -> "RealPool":
        """Empty every server's prefix cache and count served requests from now."""
        import urllib.request

        for e in self.endpoints:
            with urllib.request.urlopen(urllib.request.Request(f"http://{e}/reset_prefix_cache", method="POST"), timeout=30) as r:
                r.read()
        self._base = Pool.totals(self)  # type: ignore[arg-type]
        return self

    def _since(self) -> list[tuple[float, float, float]]:
        return [(a[0] - b[0], a[1] - b[1], a[2] - b[2]) for a, b in zip(Pool.totals(self), self._base)]  # type: ignore[arg-type]

    def served(self) -> list[float]:
        return [t[0] for t in self._since()]

    def server_ttft_ms(self) -> float | None:
        """The servers' own mean TTFT over the requests finished since `fresh`."""
        return _mean_ttft_ms(self._since())

    @property
    def pids(self) -> list[int]:
        return [srv.pid for srv in self.servers if srv.pid is not None]

    def stop(self) -> None:
        """Nothing: the servers stay up for the next router (`close` stops them)."""

    def close(self) -> None:
        for srv in self.servers:
            srv.stop()


# ---------------------------------------------------------------------- the routers
class Router:
    url: str
    procs: list[subprocess.Popen[bytes]]

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class PolicycRouter(Router):
    def __init__(self, workdir: Path, bundle: Any, slots: list[Slot], endpoints: list[str], candidates: int,
                 scrape_interval: float | None = None, scrape_budget: float | None = None) -> None:
        from policyc.client import operator_channel
        from policyc.compiler import bundle_io
        from policyc.gateway.llm_routes import HTTP1, PROTOCOL_LABEL
        from policyc.matcher.instance import Deployment, Instance
        from policyc.placer.metrics_scraper import METRICS_LABEL
        from policyc.server import convert
        from policyc.server.proto import pb_grpc

        import grpc

        path = workdir / "bundle.json"
        bundle_io.write(bundle, path)
        api, listen = free_port(), free_port()
        self.url = f"http://127.0.0.1:{listen}"
        log = open(workdir / "policyc-gateway.log", "wb")
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "policyc.cli.main", "gateway", "--bundle", str(path), "--port", str(api),
             "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{free_port()}", "--picker-port", str(free_port()),
             "--state-dir", "none", "--workdir", str(workdir / "gw"), "--max-in-flight", "4096", "--max-pending-picks", "4096",
             "--candidates", str(candidates),
             *(["--scrape-interval", f"{scrape_interval:g}"] if scrape_interval is not None else []),
             *(["--scrape-budget", f"{scrape_budget:g}"] if scrape_budget is not None else [])],
            stdout=log, stderr=log, start_new_session=True)]
        with grpc.insecure_channel(f"127.0.0.1:{api}") as probe:
            grpc.channel_ready_future(probe).result(timeout=60)
        with operator_channel(f"127.0.0.1:{api}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for s, e in zip(slots, endpoints):
                inst = Instance(id=s.instance_id, model=MODEL, labels={PROTOCOL_LABEL: HTTP1, METRICS_LABEL: "vllm"},
                                deployment=Deployment(**{**s.deployment, "endpoint": e}))
                stub.RegisterInstance(convert.register_request(inst), timeout=10)


class EnvoyRouter(Router):
    def __init__(self, workdir: Path, endpoints: list[str], policy: str) -> None:
        from policyc.gateway.envoy_process import envoy_binary

        listen, admin = free_port(), free_port()
        self.url = f"http://127.0.0.1:{listen}"
        hosts = [{"endpoint": {"address": {"socket_address": {"address": h, "port_value": int(p)}}}}
                 for h, p in (e.rsplit(":", 1) for e in endpoints)]
        boot = {
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
            "static_resources": {
                "listeners": [{"name": "in", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                               "filter_chains": [{"filters": [{
                                   "name": "envoy.filters.network.http_connection_manager",
                                   "typed_config": {
                                       "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                                       "stat_prefix": "in",
                                       "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                                           {"match": {"prefix": "/"}, "route": {"cluster": "pool", "timeout": "120s"}}]}]},
                                       "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                                           "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}],
                "clusters": [{"name": "pool", "type": "STATIC", "connect_timeout": "2s", "lb_policy": policy,
                              "circuit_breakers": {"thresholds": [{"max_connections": 100000, "max_pending_requests": 100000,
                                                                   "max_requests": 100000}]},
                              "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": hosts}]}}]}}
        path = workdir / f"envoy-{policy}.json"
        path.write_text(json.dumps(boot))
        log = open(workdir / f"envoy-{policy}.log", "wb")
        self.procs = [subprocess.Popen([envoy_binary(), "-c", str(path), "--concurrency", "1", "-l", "warning",
                                        "--base-id", str(random.randrange(1, 1 << 20))],
                                       stdout=log, stderr=log, start_new_session=True)]


class RustRouter(Router):
    def __init__(self, workdir: Path, endpoints: list[str], kind: str, policy: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        urls = [f"http://{e}" for e in endpoints]
        # its Prometheus exporter on a port of its own (the default, 29000, is one per machine: a second
        # router running beside, as in benchmarks/router_ttft.py, would not start)
        metrics = ["--prometheus-port", str(free_port())]
        if kind == "vllm-router":
            argv = [str(ROUTERS_VENV / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
                    "--policy", policy, *metrics]
        else:
            argv = [str(ROUTERS_VENV / "bin" / "sglang-router"), "launch", "--host", "127.0.0.1", "--port", str(port),
                    "--worker-urls", *urls, "--policy", policy, *metrics]
        log = open(workdir / f"{kind}-{policy}.log", "wb")
        self.procs = [subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)]


def router_available(name: str) -> str | None:
    """None, or why the router cannot run here."""
    kind = name.split(":")[0]
    if kind in ("vllm-router", "sglang-router") and not (ROUTERS_VENV / "bin" / kind).exists():
        return f"{ROUTERS_VENV / 'bin' / kind} missing: run scripts/bench_setup.sh"
    if kind.startswith("envoy") or kind == "policyc":
        from policyc.gateway.envoy_process import EnvoyError, envoy_binary

        try:
            envoy_binary()
        except EnvoyError as e:
            return str(e)
    return None


def start_router(name: str, workdir: Path, bundle: Any, slots: list[Slot], endpoints: list[str], candidates: int,
                 scrape_interval: float | None = None, scrape_budget: float | None = None) -> Router:
    if name == "policyc":
        return PolicycRouter(workdir, bundle, slots, endpoints, candidates, scrape_interval, scrape_budget)
    if name.startswith("envoy-"):
        return EnvoyRouter(workdir, endpoints, {"envoy-round-robin": "ROUND_ROBIN", "envoy-least-request": "LEAST_REQUEST"}[name])
    kind, policy = name.split(":")
    return RustRouter(workdir, endpoints, kind, policy)


# ---------------------------------------------------------------------- the load
@dataclass
class Outcome:
    status: int
    ttft_s: float | None
    tokens: int
    reason: str
    slo_ms: int
    tenant: str
    whole: bool = False  # the answer's chunks arrived together (`arrived_whole`)


WHOLE_WITHIN_S = 0.005
WHOLE_MIN_CHUNKS = 8


def arrived_whole(times: list[float]) -> bool:
    """Whether a streamed answer reached the client whole: at least `WHOLE_MIN_CHUNKS` chunks,
    more than half of them within `WHOLE_WITHIN_S` of the first. A model server writes a token a
    step (milliseconds apart here), so such an answer's first token was held back with the rest."""
    if len(times) < WHOLE_MIN_CHUNKS:
        return False
    return sum(1 for t in times if t - times[0] < WHOLE_WITHIN_S) * 2 > len(times)


def _messages(e: Entry) -> list[dict[str, str]]:
    return ([{"role": "system", "content": e.system}] if e.system else []) + [{"role": "user", "content": e.prompt}]


def _body(e: Entry) -> bytes:
    return json.dumps({"model": MODEL, "messages": _messages(e), "max_tokens": e.max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()


async def _one(session: Any, url: str, e: Entry, t0: float) -> Outcome:
    await asyncio.sleep(max(0.0, t0 + e.at - time.monotonic()))
    sent = time.monotonic()
    ttft, tokens = None, 0
    times: list[float] = []  # each content chunk's arrival
    try:
        async with session.post(f"{url}/v1/chat/completions", data=_body(e),
                                headers={"content-type": "application/json", "x-slo-ttft-ms": str(e.slo_ms)}) as r:
            if r.status != 200:
                text = (await r.read())[:300].decode(errors="replace")
                reason = r.headers.get("x-policyc-reason") or text.strip().replace("\n", " ")[:120]
                return Outcome(r.status, None, 0, reason, e.slo_ms, e.tenant)
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:  # the gateway ended the stream (its TTFT or TPOT bound): its code
                    err = chunk["error"]
                    return Outcome(0, ttft, tokens, f"stream ended: {err.get('code')}", e.slo_ms, e.tenant)
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    times.append(time.monotonic())
                    if ttft is None:
                        ttft = times[-1] - sent  # the first token (a role-only chunk may come before it)
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens") or 0)
            return Outcome(200, ttft, tokens, "", e.slo_ms, e.tenant, arrived_whole(times))
    except Exception as ex:  # noqa: BLE001 - a failed request is an outcome (missed), named
        return Outcome(0, ttft, tokens, f"{type(ex).__name__}: {ex}"[:100], e.slo_ms, e.tenant)


async def drive(url: str, trace: list[Entry]) -> tuple[list[Outcome], float]:
    import aiohttp

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        t0 = time.monotonic() + 0.2
        got = await asyncio.gather(*(_one(session, url, e, t0) for e in trace))
        return list(got), time.monotonic() - t0


PERF_VENV = REPO / ".venv-perf"  # inference-perf (Python >= 3.12), made by scripts/bench_setup.sh
TOKENIZER = REPO / ".venv-vllm" / "models" / "tiny-llama"  # the client's token counts (no Hub access here)


def drive_inference_perf(url: str, trace: list[Entry], workdir: Path) -> tuple[list[Outcome], float]:
    """The trace replayed by inference-perf (`benchmarks/inference_perf_replay.py`): the same
    requests, bodies, SLO headers and arrival times as `drive`, each request's TTFT its first
    content token as inference-perf measures it; the outcomes read back from its per-request
    lifecycle records (joined on the request's label), in trace order."""
    run = Path(tempfile.mkdtemp(prefix="perf-", dir=workdir))
    first = trace[0].at if trace else 0.0
    base = 1_700_000_000.0  # the trace CSV's clock: inference-perf replays the offsets from its first row
    with open(run / "trace.csv", "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for e in trace:
            sec, us = divmod(int(round((e.at - first) * 1e6)), 1_000_000)
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(base + sec))}.{us:06d},1,{e.max_tokens}\n")
    with open(run / "requests.jsonl", "w") as f:
        for i, e in enumerate(trace):
            f.write(json.dumps({"id": i, "tenant": e.tenant, "messages": _messages(e), "max_tokens": e.max_tokens,
                                "headers": {"x-slo-ttft-ms": str(e.slo_ms)}}) + "\n")
    config = {
        "api": {"type": "chat", "streaming": True, "slo_unit": "ms"},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": False},
        "tokenizer": {"pretrained_model_name_or_path": str(TOKENIZER)},
        "data": {"type": "mock", "path": str(run / "requests.jsonl")},  # the replay's source (see its docstring)
        "load": {"type": "trace_replay", "trace": {"file": str(run / "trace.csv"), "format": "AzurePublicDataset"},
                 "stages": [{"rate": len(trace), "duration": 1}], "num_workers": 1,
                 "worker_max_concurrency": max(100, len(trace)), "request_timeout": 120},
        "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": True,
                                         "per_request_fields": {"computed_metrics": True, "response_chunks": False}}},
        "storage": {"local_storage": {"path": str(run / "out")}},
    }
    (run / "config.json").write_text(json.dumps(config))  # YAML is a superset of JSON
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [str(PERF_VENV / "bin" / "python"), str(REPO / "benchmarks" / "inference_perf_replay.py"), "-c",
           str(run / "config.json")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(600.0, 10 * (trace[-1].at if trace else 0)))
    records = list((run / "out").rglob("per_request_lifecycle_metrics.json"))
    if done.returncode != 0 or not records:
        raise RuntimeError(f"inference-perf exited {done.returncode}: {(done.stderr or done.stdout)[-400:]}")
    rows = json.loads(records[0].read_text())
    outs: list[Outcome | None] = [None] * len(trace)
    starts, ends = [], []
    for r in rows:
        labels = (r.get("info") or {}).get("labels") or {}
        i = int(labels.get("id", -1))
        if not 0 <= i < len(trace) or outs[i] is not None:
            continue
        e = trace[i]
        starts.append(r["start_time"])
        ends.append(r["end_time"])
        err = r.get("error")
        metrics = r.get("computed_metrics") or {}
        response = (r.get("info") or {}).get("response_metrics") or {}
        usage = response.get("server_usage") or {}
        chunk_times = [float(t) for t in response.get("chunk_times") or ()]
        tokens = int(usage.get("completion_tokens") or 0)
        if err:
            kind = str(err.get("error_type", ""))
            status = int(kind.rsplit(" ", 1)[-1]) if kind.startswith("HTTP Error ") and kind[11:].isdigit() else 0
            reason = str(err.get("error_msg", "")).strip().replace("\n", " ")[:120] if status else f"{kind}: {err.get('error_msg')}"[:100]
            outs[i] = Outcome(status, None, 0, reason, e.slo_ms, e.tenant)
        elif '"error":' in (r.get("response") or ""):  # the gateway ended the stream (its TTFT or TPOT bound)
            outs[i] = Outcome(0, metrics.get("time_to_first_token"), tokens, "stream ended by the gateway", e.slo_ms, e.tenant)
        else:
            outs[i] = Outcome(200, metrics.get("time_to_first_token"), tokens, "", e.slo_ms, e.tenant,
                              arrived_whole(chunk_times))
    missing = sum(o is None for o in outs)
    final = [o if o is not None else Outcome(0, None, 0, "no record from inference-perf", e.slo_ms, e.tenant)
             for o, e in zip(outs, trace)]
    if missing:
        print(f"inference-perf: {missing} of {len(trace)} requests without a record (counted as missed)", file=sys.stderr)
    return final, (max(ends) - min(starts)) if starts else 0.0


async def warm(url: str, timeout: float = 30.0) -> None:
    """Until the router answers a small chat 200 (a gateway's pool file, a router's health checks)."""
    import aiohttp

    end = time.monotonic() + timeout
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    last = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        while time.monotonic() < end:
            try:
                async with s.post(f"{url}/v1/chat/completions", data=body, headers={"content-type": "application/json"}) as r:
                    await r.read()
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except Exception as ex:  # noqa: BLE001 - not up yet
                last = type(ex).__name__
            await asyncio.sleep(0.3)
    raise RuntimeError(f"did not answer 200 within {timeout:.0f} s ({last})")


def _tree(roots: list[int]) -> list[int]:
    """The processes `roots` started, with their descendants (the gateway's Envoy and audit writer)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def prioritise(roots: list[int], nice: int) -> list[str]:
    """Every session of the router's processes (`_tree`: the gateway's Envoy runs in a session
    of its own) given the scheduler weight of `nice` as a group: the autogroup nice
    (`/proc/PID/autogroup`, `sched(7)`). Per-process nice does nothing here: with autogroups on,
    it weighs a thread only against threads of its own session, and every router and model
    server is a session of its own. Applied the same way to every router (`--router-nice`).
    Returns the groups set, as the kernel reads them back."""
    done: dict[int, str] = {}
    for pid in _tree(roots):
        try:
            sid = os.getsid(pid)
            if sid not in done:
                Path(f"/proc/{pid}/autogroup").write_text(str(nice))
                done[sid] = Path(f"/proc/{pid}/autogroup").read_text().strip()
        except OSError as e:
            raise SystemExit(f"slo_attainment: --router-nice {nice}: process {pid}: {e} (autogroups need root and "
                             "/proc/sys/kernel/sched_autogroup_enabled = 1)") from e
    return sorted(done.values())


def sched_by_name(roots: list[int]) -> dict[str, tuple[float, float]]:
    """Seconds on a CPU and seconds runnable but waiting for one, summed over every thread of
    the processes `roots` started (the kernel's /proc/PID/task/TID/schedstat), per process name
    (`/proc/PID/comm`: Envoy and the gateway's Python; a vLLM server's API server and its
    `VLLM::EngineCore`): how much CPU each used, and how long its threads queued for a core."""
    out: dict[str, tuple[float, float]] = {}
    for pid in _tree(roots):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        run = wait = 0
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                r, w, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            except (OSError, ValueError):
                continue
            run, wait = run + int(r), wait + int(w)
        r0, w0 = out.get(name, (0.0, 0.0))
        out[name] = (r0 + run / 1e9, w0 + wait / 1e9)
    return out


def sched_since(before: dict[str, tuple[float, float]], roots: list[int]) -> dict[str, list[float]]:
    """`sched_by_name(roots)` now, less `before`: [CPU s, wait s] per process name over a trace."""
    out: dict[str, list[float]] = {}
    for k, (r, w) in sched_by_name(roots).items():
        r0, w0 = before.get(k, (0.0, 0.0))
        out[k] = [round(r - r0, 2), round(w - w0, 2)]
    return out


def pct(xs: list[float], q: float) -> float:
    """The `q` quantile of `xs` (nearest rank; NaN when empty): the percentile every TTFT figure
    of the SLO benchmarks is read with (`router_ttft.py` too)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarise(name: str, outs: list[Outcome], wall: float, tenants: tuple[tuple[str, int, float], ...] = TENANTS) -> dict[str, Any]:
    met = [o for o in outs if o.status == 200 and o.ttft_s is not None and o.ttft_s * 1e3 <= o.slo_ms]
    ttfts = [o.ttft_s for o in outs if o.status == 200 and o.ttft_s is not None]
    by_tenant = {t: round(100 * sum(1 for o in met if o.tenant == t) / max(1, sum(1 for o in outs if o.tenant == t)), 1)
                 for t, _, _ in tenants}
    refused = Counter(f"{o.status} {o.reason}" for o in outs if o.status != 200)
    return {"router": name, "requests": len(outs), "attainment_pct": round(100 * len(met) / max(1, len(outs)), 1),
            "by_tenant_pct": by_tenant, "goodput_rps": round(len(met) / wall, 2),
            "ttft_ms": {**{q: round(pct(ttfts, p) * 1e3, 1) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
                        "mean": round(1e3 * sum(ttfts) / len(ttfts), 1) if ttfts else float("nan")},
            "output_tok_s": round(sum(o.tokens for o in outs) / wall, 1), "refused": dict(refused.most_common(6)),
            "answers_whole": sum(o.whole for o in outs),
            "wall_s": round(wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=32)
    ap.add_argument("--rate", type=float, default=12.0, help="requests per second (Poisson)")
    ap.add_argument("--rates", default=None, help="several load levels, comma-separated (each its own trace)")
    ap.add_argument("--scenario", choices=tuple(SCENARIOS), default="mixed",
                    help="the trace's tenants and long-prompt shares, and the pool's default classes (see SCENARIOS)")
    ap.add_argument("--classes", default=None,
                    help="the pool's GPU class shares, CLASS:SHARE,... (default: the scenario's; mixed: "
                         + ",".join(f"{c}:{w:g}" for c, w in CLASSES) + ")")
    ap.add_argument("--contract-prefill", choices=("emulator", "model"), default="emulator",
                    help="the contract's llm.prefill: the emulated model's cost (default) or the tiny model's own")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of trace per router")
    ap.add_argument("--base-slowdown", type=float, default=10.0, help="the H100 emulators' slowdown (others by peak)")
    ap.add_argument("--max-seqs", type=int, default=4, help="each emulator's max_num_seqs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=8, help="policyc gateway --candidates (its default 8)")
    ap.add_argument("--policyc-scrape-interval", type=float, default=None, metavar="SECONDS",
                    help="policyc gateway --scrape-interval (default: the gateway's own, 50 ms); a diagnosis setting")
    ap.add_argument("--policyc-scrape-budget", type=float, default=None, metavar="SCRAPES_PER_S",
                    help="policyc gateway --scrape-budget (default: the gateway's own, 200 scrapes/s over the fleet)")
    ap.add_argument("--real-vllm", type=int, default=0, metavar="N",
                    help="N real vLLM servers (1-2, one per core; .venv-vllm) instead of the emulators, declared as "
                         "--classes (default all H100: they are the same CPU), the contract's prefill the model's own")
    ap.add_argument("--router-nice", type=int, default=0, metavar="N",
                    help="every router's processes get the scheduler weight of nice N as a group (autogroup, e.g. -10), "
                         "the same for each router: on a machine whose cores the model servers' engines hold (real vLLM on "
                         "the CPU), the router gets a core when it needs one, as where the engines run on GPUs; 0: off")
    ap.add_argument("--router-core", type=int, default=None, metavar="C",
                    help="with --real-vllm: every router and the load generator run on core C alone, the model servers "
                         "(their engines, API servers and threads) on the other cores, as on a GPU host where the router "
                         "never competes with the engines for a core; default: every process on every core")
    ap.add_argument("--client", choices=("inference-perf", "builtin"), default="inference-perf",
                    help="the load generator: inference-perf in .venv-perf (scripts/bench_setup.sh), or this file's "
                         "own aiohttp replay of the same trace")
    ap.add_argument("--trace", type=Path, help="a trace file (JSON lines) to replay instead of making one")
    ap.add_argument("--routers", default=",".join(ALL_ROUTERS), help="comma-separated, of: " + ", ".join(ALL_ROUTERS))
    ap.add_argument("--out", type=Path, default=None, help="results JSON (default: a temp dir, printed)")
    ap.add_argument("--setup", action="store_true", help="install the peer routers and inference-perf first (scripts/bench_setup.sh)")
    ap.add_argument("--quick", action="store_true", help="8 instances, 8 s a router")
    args = ap.parse_args()
    if args.quick:
        args.instances, args.duration = 8, 8.0
    if args.setup:
        subprocess.run(["bash", str(REPO / "scripts" / "bench_setup.sh")], check=True)
    if args.client == "inference-perf" and not (PERF_VENV / "bin" / "python").exists():
        print(f"slo_attainment: {PERF_VENV} has no inference-perf: run scripts/bench_setup.sh (or --setup), "
              "or pass --client builtin", file=sys.stderr)
        return 2
    routers = [r for r in args.routers.split(",") if r]
    bad = [r for r in routers if r not in ALL_ROUTERS]
    if bad:
        print(f"slo_attainment: unknown routers {bad}; known: {', '.join(ALL_ROUTERS)}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="policyc-slo-"))
    try:
        rates = [float(x) for x in args.rates.split(",")] if args.rates else [args.rate]
    except ValueError:
        print(f"slo_attainment: --rates {args.rates!r}: numbers, comma-separated", file=sys.stderr)
        return 2
    scenario = SCENARIOS[args.scenario]
    classes = parse_classes(args.classes) if args.classes else scenario.classes
    real: RealPool | None = None
    if args.real_vllm:
        if not 1 <= args.real_vllm <= 2:
            print(f"slo_attainment: --real-vllm {args.real_vllm}: 1 or 2 (each takes a core and ~3 GB)", file=sys.stderr)
            return 2
        args.instances, args.contract_prefill, args.base_slowdown = args.real_vllm, "model", 1.0
        classes = parse_classes(args.classes) if args.classes else (("H100", 1.0),)
    slots, bundle = pool_slots(args.instances, args.base_slowdown, classes, args.contract_prefill)
    if args.real_vllm:
        t = time.monotonic()
        cores = os.sched_getaffinity(0)
        if args.router_core is not None:
            if args.router_core not in cores or len(cores) < 2:
                print(f"slo_attainment: --router-core {args.router_core}: one of this process's cores {sorted(cores)}, "
                      "leaving at least one to the model servers", file=sys.stderr)
                return 2
            os.sched_setaffinity(0, cores - {args.router_core})  # the servers' processes inherit it, threads and all
        real = RealPool(args.real_vllm, workdir)
        slots = on_their_devices(slots, real.devices)
        if args.router_core is not None:
            os.sched_setaffinity(0, {args.router_core})  # and every router and client started from here, this one
        print(json.dumps({"real_vllm": real.endpoints, "ready_s": round(time.monotonic() - t, 1)}), flush=True)
    try:
        return _run_all(args, routers, rates, scenario, slots, bundle, workdir, real)
    finally:
        if real is not None:
            real.close()


def _run_all(args: argparse.Namespace, routers: list[str], rates: list[float], scenario: Scenario, slots: list[Slot],
             bundle: Any, workdir: Path, real: RealPool | None) -> int:
    shapes, results = [], []
    for rate in rates:
        if args.trace:
            trace = [Entry(**json.loads(line)) for line in args.trace.read_text().splitlines() if line.strip()]
        else:
            trace = make_trace(args.seed, rate, args.duration, scenario)
        (workdir / f"trace-{rate:g}.jsonl").write_text("".join(json.dumps(asdict(e)) + "\n" for e in trace))
        shape = {"requests": len(trace), "rate_rps": rate, "duration_s": args.duration,
                 "scenario": args.scenario, "tenants": {t: f"{s} ms, {w:.0%}" for t, s, w in scenario.tenants},
                 "long_share": round(sum(e.long for e in trace) / max(1, len(trace)), 2),
                 "prefix_share": round(sum(e.group >= 0 for e in trace) / max(1, len(trace)), 2),
                 "pool": dict(Counter(f"{s.gpu_model} (slowdown {s.slowdown:.1f})" for s in slots)),
                 "gpus_declared": len({(s.deployment["host"], s.deployment["gpu"]) for s in slots}),
                 "max_num_seqs": "vLLM's own" if real else args.max_seqs, "contract_prefill": args.contract_prefill,
                 "servers": f"{len(real.endpoints)} real vLLM" if real else "emulators", "client": args.client}
        shapes.append(shape)
        print(json.dumps({"trace": shape, "workdir": str(workdir)}), flush=True)
        if real is not None:  # each load level: its own concurrency
            warm_servers(real, trace, workdir)
        results += run_routers(routers, workdir, bundle, slots, trace, args, rate, scenario.tenants, real)
    out = args.out or workdir / "results.json"
    out.write_text(json.dumps({"traces": shapes, "results": results}, indent=1))
    print(f"results: {out}")
    return 0


def warm_servers(real: RealPool, trace: list[Entry], workdir: Path) -> None:
    """The trace replayed once through Envoy round robin, not measured, before a load level's
    first router: the servers' first run at a trace's concurrency is slower (measured at 8 req/s:
    the first router's TTFT p50 15-40 ms above its own later runs, whichever router came
    first), and the router listed first would pay for it."""
    router = EnvoyRouter(workdir, real.fresh().endpoints, "ROUND_ROBIN")
    try:
        asyncio.run(warm(router.url))
        outs, wall = asyncio.run(drive(router.url, trace))
        print(json.dumps({"servers_warmed": summarise("envoy-round-robin (warm-up, not a result)", outs, wall)["ttft_ms"]}),
              flush=True)
    finally:
        router.stop()


def run_routers(routers: list[str], workdir: Path, bundle: Any, slots: list[Slot], trace: list[Entry],
                args: argparse.Namespace, rate: float, tenants: tuple[tuple[str, int, float], ...] = TENANTS,
                real: RealPool | None = None) -> list[dict[str, Any]]:
    """One load level: each router in turn on a fresh pool, the same trace."""
    results: list[dict[str, Any]] = []
    for name in routers:
        why = router_available(name)
        if why is not None:
            results.append({"rate_rps": rate, "router": name, "not_run": why})
            print(json.dumps(results[-1]), flush=True)
            continue
        pool: Pool | RealPool = real.fresh() if real is not None else Pool(slots, args.max_seqs)
        router: Router | None = None
        try:
            router = start_router(name, workdir, bundle, slots, pool.endpoints, args.candidates, args.policyc_scrape_interval,
                                  args.policyc_scrape_budget)
            asyncio.run(warm(router.url))
            roots = [p.pid for p in router.procs]
            groups = prioritise(roots, args.router_nice) if args.router_nice else []
            router0 = sched_by_name(roots)
            servers0 = sched_by_name(real.pids) if real is not None else {}
            if args.client == "inference-perf":
                outs, wall = drive_inference_perf(router.url, trace, workdir)
            else:
                outs, wall = asyncio.run(drive(router.url, trace))
            cpu = sched_since(router0, roots)
            servers = sched_since(servers0, real.pids) if real is not None else {}
            results.append({"rate_rps": rate, **summarise(name, outs, wall, tenants),
                            "router_cpu_s": round(sum(r for r, _ in cpu.values()), 2),
                            "router_cpu_wait_s": round(sum(w for _, w in cpu.values()), 2),
                            "router_cpu_by_process_s": {k: r for k, (r, _) in cpu.items()},
                            **({"servers_cpu_and_wait_s": servers} if servers else {}),
                            **({"router_groups": groups} if groups else {})})
            time.sleep(1.0)  # the last streams' ends reach the servers' counters
            served = pool.served()
            by_class: Counter[str] = Counter()
            for s, n in zip(slots, served):
                by_class[s.gpu_model] += int(n)
            results[-1]["served_by_class"] = dict(by_class)
            results[-1]["busiest_server_share_pct"] = round(100 * max(served) / max(1.0, sum(served)), 1)
            results[-1]["server_ttft_mean_ms"] = pool.server_ttft_ms()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            results.append({"rate_rps": rate, "router": name, "not_run": f"{type(e).__name__}: {e}"[:300]})
        finally:
            if router is not None:
                router.stop()
            pool.stop()
        print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
