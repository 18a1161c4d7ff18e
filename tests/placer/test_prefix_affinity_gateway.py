"""Prefix-cache affinity on the path real requests take: a real `policyc gateway` process
(decision service, picker, Envoy) with two emulated vLLM servers (vLLM's routes, metrics and
automatic prefix caching) on two GPUs of one host and class, chat requests through Envoy.

The contract is the tiny model's with the prefill cost of a larger one, so the prefill a cached
prefix saves is worth more than the picker's hysteresis margin. Each tenant's system prompt
is first served on its own server; then, both servers registered and idle, requests of the
two tenants alternate and each returns to the server holding its prefix (where the server's
own prefix cache hits), although the picker's hysteresis alone would keep every request on
the last server chosen.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_rig import free_port  # noqa: E402
from llm_rig import LLM, llm_bundle  # noqa: E402

from policyc.client import operator_channel  # noqa: E402
from policyc.compiler import bundle_io  # noqa: E402
from policyc.gateway.llm_routes import HTTP1, PROTOCOL_LABEL  # noqa: E402
from policyc.matcher.instance import Instance  # noqa: E402
from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec  # noqa: E402
from policyc.placer import PlacementPlan  # noqa: E402
from policyc.placer.metrics_scraper import METRICS_LABEL  # noqa: E402
from policyc.server import convert  # noqa: E402
from policyc.server.proto import pb, pb_grpc  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
POLICYC = [sys.executable, "-m", "policyc.cli.main"]
PREFILL = "prefill: 1.9e6 FLOP"


def _bundle(workdir: Path) -> Path:
    text = (REPO / "policies" / "llm" / "tiny-llm.contract").read_text()
    assert PREFILL in text
    folder = workdir / "contracts"
    folder.mkdir()
    # 0.62 ms a prompt token on an H100 (a large model's prefill): ~0.3 s for these prompts, the
    # prefix credit far above the picker's hysteresis margin and the in-flight seconds of a
    # request whose access-log end is still on its way on a loaded machine
    (folder / "tiny-llm.contract").write_text(text.replace(PREFILL, "prefill: 1.84e11 FLOP", 1))
    path = workdir / "bundle.json"
    bundle_io.write(llm_bundle((folder,)), path)
    return path


def _two_gpus_of_one_host(bundle: Path) -> tuple[Instance, Instance]:
    """Two GPUs of one host and class whose modelled latency stays close (the simulated
    cluster's load differs per GPU: the pair is the one closest over a few ticks of the same
    seeded simulation the gateway runs), so the prefix credit, not the simulated load,
    decides between them."""
    from policyc.placer import Placer, Refresher, SimulatedCluster
    from policyc.placer.llm_price import RequestPrice
    from policyc.server.config import ClusterSpec
    from policyc.server.fleet import admissible_fleet

    b = bundle_io.load(bundle)
    contract = b.contract(LLM)
    assert contract is not None
    c = ClusterSpec()
    sim = SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack)
    refresher = Refresher(sim)
    placer = Placer(refresher)
    groups: dict[tuple[str, str], list[Instance]] = {}
    for inst in admissible_fleet(b, sim.gpu_slots(), models=[LLM]):
        groups.setdefault((inst.deployment.host, inst.deployment.gpu_model), []).append(inst)
    totals: dict[str, list[float]] = {}
    for _ in range(8):
        refresher.tick()
        for insts in groups.values():
            for inst in insts:
                plan = placer.place([inst], 5.0, contract, price=RequestPrice(600.0, 2.0, True))
                totals.setdefault(inst.id, []).append(plan.latency.total if isinstance(plan, PlacementPlan) else float("inf"))
    fit = {k: v for k, v in totals.items() if all(x < 5.0 for x in v)}  # placed at every tick (no class refusal)
    pairs = [(max(abs(u - v) for u, v in zip(fit[a.id], fit[b_.id])), a, b_)
             for insts in groups.values() for i, a in enumerate(insts) for b_ in insts[i + 1:] if a.id in fit and b_.id in fit]
    assert pairs, "no two GPUs of one host and class can serve these prompts"
    gap, a, b_ = min(pairs, key=lambda x: x[0])
    assert gap < 0.1, f"no two GPUs of one host and class model within 100 ms of each other ({gap * 1e3:.1f} ms)"
    return a, b_


class _Gateway:
    def __init__(self, workdir: Path) -> None:
        self.api, self.listen = free_port(), free_port()
        self.bundle = _bundle(workdir)
        self.proc = subprocess.Popen(
            POLICYC + ["gateway", "--bundle", str(self.bundle), "--port", str(self.api), "--listen",
                       f"127.0.0.1:{self.listen}", "--admin", f"127.0.0.1:{free_port()}", "--picker-port", str(free_port()),
                       "--state-dir", "none", "--workdir", str(workdir / "gw")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        with grpc.insecure_channel(f"127.0.0.1:{self.api}") as probe:
            grpc.channel_ready_future(probe).result(timeout=90)
        self.channel = operator_channel(f"127.0.0.1:{self.api}")
        self.stub = pb_grpc.DecisionsStub(self.channel)

    def register(self, slot: Instance, endpoint: str) -> None:
        inst = Instance(id=slot.id, model=LLM, labels={PROTOCOL_LABEL: HTTP1, METRICS_LABEL: "vllm"},
                        deployment=slot.deployment.model_copy(update={"endpoint": endpoint}))
        self.stub.RegisterInstance(convert.register_request(inst), timeout=10)

    def deregister(self, slot: Instance) -> None:
        self.stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=slot.id), timeout=10)

    def chat(self, system: str, question: str) -> None:
        """One chat through Envoy, retried while Envoy's pool file catches up with a registration."""
        body = json.dumps({"model": LLM, "max_tokens": 2, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": question}]}).encode()
        deadline, status, text = time.monotonic() + 30, 0, b""
        while time.monotonic() < deadline:
            c = http.client.HTTPConnection("127.0.0.1", self.listen, timeout=30)
            try:
                c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
                r = c.getresponse()
                status, text = r.status, r.read()
            finally:
                c.close()
            if status == 200:
                return
            time.sleep(0.2)
        raise AssertionError(f"chat through the gateway: HTTP {status} {text[:300]!r}")

    def stop(self) -> None:
        self.channel.close()
        os.killpg(self.proc.pid, signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err[-3000:]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Gateway]:
    g = _Gateway(tmp_path_factory.mktemp("prefix-gw"))
    yield g
    g.stop()


def test_each_tenant_returns_to_the_server_holding_its_prefix(gateway: _Gateway) -> None:
    x_slot, y_slot = _two_gpus_of_one_host(gateway.bundle)
    systems = {t: f"You are the assistant of tenant {t}. " + " ".join(f"{t}-rule-{i}" for i in range(200)) for t in "AB"}
    with EmulatorServer([EmulatorSpec(LLM)]) as x, EmulatorServer([EmulatorSpec(LLM)]) as y:
        engines = {"x": x._instances[0].engine, "y": y._instances[0].engine}

        def served(tenant: str, question: str) -> str:
            """Which server answered (the one whose prefix-cache queries grew) and did it hit its cache."""
            before = {k: (e.prefix_queries, e.prefix_hits) for k, e in engines.items()}
            gateway.chat(systems[tenant], question)
            grew = [k for k, e in engines.items() if e.prefix_queries > before[k][0]]
            assert len(grew) == 1, grew
            return grew[0] + ("+hit" if engines[grew[0]].prefix_hits > before[grew[0]][1] else "")

        # each tenant's prompt first served on its own server (the other not registered then)
        gateway.register(x_slot, x.endpoints[0])
        assert served("A", "first question of A") == "x"
        gateway.register(y_slot, y.endpoints[0])
        gateway.deregister(x_slot)
        assert served("B", "first question of B") == "y"
        gateway.register(x_slot, x.endpoints[0])
        try:
            # both registered and idle: each tenant goes back to its prefix, the server's cache hits
            got = [served(t, f"question {i} of {t}") for i in range(3) for t in "ABAB"]
            assert got == ["x+hit", "y+hit", "x+hit", "y+hit"] * 3, got
        finally:
            gateway.deregister(x_slot)
            gateway.deregister(y_slot)
