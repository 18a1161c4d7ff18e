"""Measured state on the real path: a real `policyc gateway` process (decision service,
picker, Envoy) with emulated vLLM servers (vLLM's routes and `vllm:*` metrics) registered
over `RegisterInstance` with a `metrics: vllm` label. The service scrapes their `/metrics`
itself (`--scrape-interval`, server/app.py wiring placer/measured.py `ScrapedFleet`), and:

- a server's queue gauge reaches the placer within a scrape tick and a measured tick (50 + 50 ms,
  asserted with slack for a loaded machine: median of five rises, from the moment the emulator's own queue, read in-process, reached 3 to the
  first Explain whose plan names that measured queue);
- with two servers, the one with the deep measured queue is avoided, by Explain and by a
  chat request through Envoy;
- a server that hangs (stopped with SIGSTOP): its reading ages past the signal's bound and
  the plan says it is stale and that the modelled queue stands.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
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
from policyc.modelserver.emulator_engine import TimingModel  # noqa: E402
from policyc.placer.metrics_scraper import METRICS_LABEL  # noqa: E402
from policyc.server import convert  # noqa: E402
from policyc.server.proto import pb, pb_grpc  # noqa: E402

POLICYC = [sys.executable, "-m", "policyc.cli.main"]
ONE_AT_A_TIME = TimingModel(max_num_seqs=1)  # every request past the first waits: the queue is what the test sends


def _slots(n: int) -> list[Instance]:
    from policyc.placer import SimulatedCluster
    from policyc.server.config import ClusterSpec
    from policyc.server.fleet import admissible_fleet

    c = ClusterSpec()
    slots = SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack).gpu_slots()
    out: list[Instance] = []
    for inst in admissible_fleet(llm_bundle(), slots, models=[LLM]):
        if all((i.deployment.host, i.deployment.gpu) != (inst.deployment.host, inst.deployment.gpu) for i in out):
            out.append(inst)
        if len(out) == n:
            return out
    raise AssertionError(f"fewer than {n} GPUs admit {LLM}")


class _Gateway:
    def __init__(self, workdir: Path) -> None:
        path = workdir / "bundle.json"
        bundle_io.write(llm_bundle(), path)
        self.api, self.listen = free_port(), free_port()
        self.proc = subprocess.Popen(
            POLICYC + ["gateway", "--bundle", str(path), "--port", str(self.api), "--listen", f"127.0.0.1:{self.listen}",
                       "--admin", f"127.0.0.1:{free_port()}", "--picker-port", str(free_port()), "--state-dir", "none",
                       "--workdir", str(workdir / "gw"), "--scrape-interval", "0.05"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        with grpc.insecure_channel(f"127.0.0.1:{self.api}") as probe:
            grpc.channel_ready_future(probe).result(timeout=60)
        self.channel = operator_channel(f"127.0.0.1:{self.api}")
        self.stub = pb_grpc.DecisionsStub(self.channel)

    def register(self, slot: Instance, endpoint: str) -> None:
        inst = Instance(id=slot.id, model=LLM, labels={PROTOCOL_LABEL: HTTP1, METRICS_LABEL: "vllm"},
                        deployment=slot.deployment.model_copy(update={"endpoint": endpoint}))
        self.stub.RegisterInstance(convert.register_request(inst), timeout=10)

    def deregister(self, slot: Instance) -> None:
        self.stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=slot.id), timeout=10)

    def plan(self) -> pb.Placement:
        e = self.stub.Explain(pb.DecideRequest(headers={"X-Model": LLM}), timeout=10)
        assert e.decision.outcome == pb.ADMITTED, e.decision.rejection
        return e.decision.placement

    def stop(self) -> str:
        self.channel.close()
        os.killpg(self.proc.pid, signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err[-3000:]
        return err


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Gateway]:
    g = _Gateway(tmp_path_factory.mktemp("measured-gw"))
    yield g
    g.stop()


def _waiting_in(plan: pb.Placement, gpu_key: str) -> float | None:
    """The measured queue the plan names for `gpu_key` (None: not named)."""
    for line in plan.reasons:
        m = re.match(rf"queue depth of {re.escape(gpu_key)}: ([0-9.e+]+) waiting, measured", line)
        if m:
            return float(m.group(1))
    return None


def _fill(endpoint: str, n: int, max_tokens: int) -> list[threading.Thread]:
    """`n` completions sent at once straight to the server (not through the gateway)."""
    host, port = endpoint.split(":")
    body = json.dumps({"model": LLM, "prompt": "hello there", "max_tokens": max_tokens}).encode()

    def one() -> None:
        c = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
            c.getresponse().read()
        finally:
            c.close()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def _page_trip(endpoint: str) -> float:
    """One round trip of the server's /metrics page, as the service's scraper makes it."""
    host, port = endpoint.split(":")
    t = time.monotonic()
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        c.request("GET", "/metrics")
        c.getresponse().read()
    finally:
        c.close()
    return time.monotonic() - t


def _until(cond, what: str, timeout: float = 30.0, every: float = 0.005) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def test_a_server_queue_reaches_the_placer_within_100_ms_and_steers_placement(gateway: _Gateway) -> None:
    a_slot, b_slot = _slots(2)
    a_key, b_key = (f"{s.deployment.host}/{s.deployment.gpu}" for s in (a_slot, b_slot))
    with EmulatorServer([EmulatorSpec(LLM, timing=ONE_AT_A_TIME)]) as a, \
            EmulatorServer([EmulatorSpec(LLM, timing=ONE_AT_A_TIME)]) as b:
        gateway.register(a_slot, a.endpoints[0])
        try:
            _until(lambda: _waiting_in(gateway.plan(), a_key) == 0, "A's idle queue in the plan")
            delays: list[float] = []
            plan_trips: list[float] = []  # the test's own Explain round trips: a rise is seen only once one returns
            page_trips: list[float] = []  # A's /metrics round trips: what each of the service's scrapes waits

            def timed_plan() -> pb.Placement:
                t = time.monotonic()
                plan = gateway.plan()
                plan_trips.append(time.monotonic() - t)
                return plan

            engine = a._instances[0].engine  # the server's own queue, read in-process: when it changed
            for _ in range(5):  # rises: from the server's queue reaching 3 to the plan naming it
                threads = _fill(a.endpoints[0], 6, 200)  # the queue stays at 3 or more for ~1.1 s (3 answers of 200 tokens)
                _until(lambda: len(engine.waiting) >= 3, "A's queue", timeout=30, every=0.0005)
                changed = time.monotonic()
                _until(lambda: (_waiting_in(timed_plan(), a_key) or 0) >= 3, "A's queue in the plan")
                delays.append(time.monotonic() - changed)
                page_trips += [_page_trip(a.endpoints[0]) for _ in range(3)]  # while the queue is still there
                for t in threads:
                    t.join(60)
                _until(lambda: _waiting_in(gateway.plan(), a_key) == 0, "A's queue drained in the plan")
            # By design within one scrape tick and one measured tick (50 + 50 ms): 150 ms on a quiet machine
            # (medians 55-110 ms measured at load 6-9). A loaded 2-core machine also makes the server's
            # page and the test's Explain slow, and the delay holds one of each: the bound is 150 ms or the
            # tick and refresh plus twice their slow (p90) round trips measured in this run, the larger.
            slow = statistics.quantiles(plan_trips, n=10)[-1] + statistics.quantiles(page_trips, n=10)[-1]
            bound = max(0.150, 0.05 + 0.05 + 2 * slow)
            print(f"queue gauge -> plan: {', '.join(f'{d * 1e3:.0f}' for d in delays)} ms; bound {bound * 1e3:.0f} ms "
                  f"(p90 Explain + /metrics round trips {slow * 1e3:.0f} ms)")
            assert statistics.median(delays) < bound, (delays, bound)

            gateway.register(b_slot, b.endpoints[0])
            threads = _fill(a.endpoints[0], 8, 600)
            _until(lambda: (_waiting_in(gateway.plan(), b_key) == 0 and gateway.plan().gpu != ""
                            and f"{gateway.plan().host}/{gateway.plan().gpu}" == b_key), "placement away from A's queue")
            b_engine = b._instances[0].engine
            served_by_b = b_engine.generation_tokens
            c = http.client.HTTPConnection("127.0.0.1", gateway.listen, timeout=30)
            deadline, status, headers = time.monotonic() + 20, 0, {}
            while time.monotonic() < deadline:  # Envoy loads the pool file within a few hundred ms of registering
                c.request("POST", "/v1/chat/completions", json.dumps({
                    "model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode(),
                    {"content-type": "application/json"})
                r = c.getresponse()
                status, headers = r.status, {k.lower(): v for k, v in r.getheaders()}
                r.read()
                if status == 200:
                    break
                time.sleep(0.2)
            c.close()
            assert status == 200, (status, headers)
            assert b_engine.generation_tokens - served_by_b == 4  # answered by B, away from A's queue
            for t in threads:
                t.join(60)
        finally:
            gateway.deregister(a_slot)
            if b_slot.id in {i.id for i in _listed(gateway)}:
                gateway.deregister(b_slot)


def _listed(gateway: _Gateway) -> list[pb.Instance]:
    return list(gateway.stub.ListInstances(pb.ListInstancesRequest(), timeout=10).instances)


def test_a_hung_server_is_reported_stale_in_the_plan(gateway: _Gateway) -> None:
    """The emulated server in a process of its own, stopped (SIGSTOP): its /metrics hangs,
    the scrapes time out, the last reading ages past the signal's bound."""
    (slot,) = _slots(1)
    key = f"{slot.deployment.host}/{slot.deployment.gpu}"
    proc = subprocess.Popen([sys.executable, "-c", EMULATOR], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        assert endpoint.startswith("127.0.0.1:"), endpoint
        gateway.register(slot, endpoint)
        _until(lambda: _waiting_in(gateway.plan(), key) == 0, "the server's queue in the plan")
        os.kill(proc.pid, signal.SIGSTOP)
        stale: list[str] = []

        def reported() -> bool:
            stale[:] = [x for x in gateway.plan().reasons if x.startswith(f"queue depth of {key} is stale")]
            return bool(stale)
        _until(reported, "the stale reading in the plan", timeout=20)
        assert "the modelled queue stands" in stale[0], stale
    finally:
        proc.kill()
        proc.wait(10)
        if slot.id in {i.id for i in _listed(gateway)}:
            gateway.deregister(slot)


EMULATOR = f"""
import time
from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec
s = EmulatorServer([EmulatorSpec({LLM!r})]).start()
print(s.endpoints[0], flush=True)
time.sleep(3600)
"""
