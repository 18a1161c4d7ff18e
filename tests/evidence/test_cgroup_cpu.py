"""CPU-seconds measured by the kernel: each model server policyc starts is in a cgroup of its
own, and a call's accounting record carries its process's cgroup CPU over the call's span,
apportioned (`audit/cgroup_cpu.py`), with the rule in its method.

The known cost: the test runs the very model file in this process with onnxruntime's same
options (one thread) and takes the thread's CPU time per run (`time.thread_time`, which a
loaded machine does not inflate the way it does wall time), beside each call. A call through
the real gateway (Envoy, the picker, the access log) to the model server must then be recorded
within 20 % of it (the median of five pairs); two concurrent calls split what their process used between them.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import onnxruntime as ort
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gateway"))
from gateway_rig import SMALL, free_port  # noqa: E402

from policyc.audit.cgroup_cpu import cgroup_of_pid, read_usage_seconds  # noqa: E402
from policyc.audit.query import AuditReader  # noqa: E402
from policyc.client import operator_channel  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.gateway.runner import Gateway, GatewayOptions  # noqa: E402
from policyc.matcher import Instance  # noqa: E402
from policyc.matcher.instance import admission_problems  # noqa: E402
from policyc.modelserver.client import OipClient  # noqa: E402
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec  # noqa: E402
from policyc.onnxgate.contract_metadata import embed_contract  # noqa: E402
from policyc.onnxgate.count import count_flops  # noqa: E402
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer  # noqa: E402
from policyc.server import convert  # noqa: E402
from policyc.server.app import DecisionServer, ServerThread  # noqa: E402
from policyc.server.config import ServeConfig  # noqa: E402
from policyc.server.proto import pb_grpc  # noqa: E402

MODEL = "cpu-burner"
TOKENS = 1024
SPEC = TransformerSpec(vocab=256, d_model=256, heads=4, layers=6, d_ff=1024, max_len=TOKENS)
IDS = np.random.default_rng(0).integers(0, SPEC.vocab, size=(1, TOKENS), dtype=np.int64)
META = (("x-model", MODEL), ("x-data-region", "us-west"), ("x-tenant", "shopwave"))

CONTRACT = """
contract cpu-burner version "1.0.0" {{
  compute {{
    flops_per_request: {flops:.6e} .. {flops:.6e}
    tokens: {tokens}
    precision: fp32
    efficiency: 50 %
  }}
  memory {{
    bandwidth: >= 1 GB/s
    burst: <= 2 s
  }}
  dependencies {{
    async_callbacks: no
    cuda: >= 12.1
  }}
  slo {{
    latency: <= 5 s
    allowance: 100 ms
  }}
}}
"""


class Rig:
    def __init__(self, workdir: Path) -> None:
        model = build_transformer(SPEC, seed=0)
        flops = count_flops(model, TOKENS).total()
        (workdir / "policies").mkdir()
        (workdir / "policies" / "cpu-burner.contract").write_text(CONTRACT.format(flops=flops, tokens=TOKENS))
        r = compile_paths([str(REPO / "policies"), str(workdir / "policies")], analyse=False)
        assert r.ok and r.bundle is not None, r.diagnostics
        self.bundle = r.bundle
        contract = r.bundle.contract(MODEL)
        assert contract is not None
        self.model_path = workdir / "cpu-burner.onnx"
        onnx.save_model(embed_contract(model, contract), str(self.model_path))
        self.workdir = workdir
        self.thread = ServerThread(DecisionServer(r.bundle, ServeConfig(cluster=SMALL, audit_log=workdir / "audit.db")))
        self.thread.start()
        server = self.thread.server
        assert server.cluster is not None
        slot = next(s for s in server.cluster.gpu_slots() if s.region == "us-west"
                    and not admission_problems(Instance(id="probe", model=MODEL, deployment=s.to_deployment()), r.bundle))
        self.instance_id = f"{MODEL}@{slot.host}/{slot.gpu}"
        self.models = ModelPool([ServerSpec((InstanceSpec(self.instance_id, self.model_path),))],
                                workdir=workdir / "servers", fork=False).start(timeout=90)
        inst = Instance(id=self.instance_id, model=MODEL, deployment=slot.to_deployment().model_copy(
            update={"endpoint": self.models.endpoint(self.instance_id)}))
        with operator_channel(f"127.0.0.1:{server.port}") as ch:
            pb_grpc.DecisionsStub(ch).RegisterInstance(convert.register_request(inst, onnx_model=self.model_path.read_bytes()),
                                                       timeout=60)
        self.listen = f"127.0.0.1:{free_port()}"
        self.gateway = Gateway(self.thread, GatewayOptions(listen=self.listen, admin=f"127.0.0.1:{free_port()}",
                                                           workdir=workdir / "gateway", accounting=True)).start()

    def stop(self) -> None:
        for step in (self.gateway.stop, self.thread.stop, self.models.stop):
            try:
                step()
            except Exception:  # noqa: BLE001 - stop everything that was started
                pass


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    r = Rig(Path(tempfile.mkdtemp(prefix="policyc-cgroup-cpu-")))
    yield r
    r.stop()


class KnownCost:
    """The model's CPU time per run here, measured on demand: the same file, onnxruntime's same
    options (one thread), the thread's CPU time. Measured beside each call, not once before
    them: on this box's two vCPUs a run's CPU time moves with what the other vCPU is doing
    (seen: 0.2007 s measured first, then calls of 0.2063-0.2525 s)."""

    def __init__(self, path: Path) -> None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        self.name = self.sess.get_inputs()[0].name
        self.sess.run(None, {self.name: IDS})

    def seconds(self, runs: int = 3) -> float:
        """The median of `runs` runs' thread CPU time."""
        costs = []
        for _ in range(runs):
            t = time.thread_time()
            self.sess.run(None, {self.name: IDS})
            costs.append(time.thread_time() - t)
        return float(np.median(costs))


def accounting_of(rig: Rig, decision_id: str, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with AuditReader.open(rig.workdir / "audit.db") as reader:
            got = [e.record for e in reader.actions_for(decision_id) if e.record.kind == "accounting"]  # type: ignore[union-attr]
        if got:
            return got[0]
        time.sleep(0.05)
    raise AssertionError(f"no accounting record for {decision_id} within {timeout} s")


def _watched(rig: Rig, client: OipClient) -> None:
    """Calls until the gateway samples the server's cgroup (the first sight of an endpoint starts it)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        a = client.infer(MODEL, IDS, metadata=META, timeout=60)
        if accounting_of(rig, a.decision_id).resources.compute_seconds.source == "apportioned":
            return
    raise AssertionError("the gateway never apportioned a call's CPU from the server's cgroup")


def test_model_server_runs_in_a_cgroup_of_its_own(rig: Rig) -> None:
    proc = rig.models.process_of(rig.instance_id)
    assert proc.pid is not None and proc.cgroup is not None
    assert cgroup_of_pid(proc.pid) == proc.cgroup and proc.cgroup.name == f"policyc-modelserver-{proc.pid}"
    assert (proc.cgroup / "cgroup.procs").read_text().split() == [str(proc.pid)]
    assert read_usage_seconds(proc.cgroup) > 0


def test_a_calls_cgroup_cpu_is_within_20_percent_of_its_known_cost(rig: Rig) -> None:
    cost = KnownCost(rig.model_path)
    with OipClient(rig.listen) as client:
        _watched(rig, client)
        pairs = []
        for _ in range(5):
            known = cost.seconds()
            assert known > 0.02, known  # a cost well above the request's own handling
            a = client.infer(MODEL, IDS, metadata=META, timeout=60)
            rec = accounting_of(rig, a.decision_id)
            cpu = rec.resources.compute_seconds
            assert cpu.source == "apportioned" and cpu.method.startswith("cgroup: cpu.stat usage_usec")
            assert "overlap" in cpu.method  # the rule is stated
            detail = json.loads(rec.detail)
            assert detail["attempts"][0]["compute_seconds"] == a.compute_us / 1e6  # the server's own figure kept
            pairs.append((known, cpu.value))
    ratio = float(np.median([got / known for known, got in pairs]))
    print("known and recorded (cgroup, apportioned) CPU per call, s: " + ", ".join(f"{k:.4f}/{g:.4f}" for k, g in pairs))
    assert 0.8 <= ratio <= 1.2, (ratio, pairs)


def test_concurrent_calls_split_their_process_cpu(rig: Rig) -> None:
    known = KnownCost(rig.model_path).seconds(5)
    with OipClient(rig.listen) as client:
        _watched(rig, client)
        cg = rig.models.process_of(rig.instance_id).cgroup
        assert cg is not None
        before = read_usage_seconds(cg)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: client.infer(MODEL, IDS, metadata=META, timeout=60), range(2)))
        spent = read_usage_seconds(cg) - before
    shares = [accounting_of(rig, a.decision_id).resources.compute_seconds for a in answers]
    assert all(s.source == "apportioned" and s.value > 0 for s in shares), shares
    total = sum(s.value for s in shares)
    # together they hold what the process spent over their spans: no more than it spent, and
    # at least two calls' known cost. Not "about" two calls' cost: two calls at once on two
    # cores cost the server more than two alone (onnxruntime's pools contend and spin), and
    # that extra is real CPU the calls caused, which the cgroup rightly counts.
    assert total <= spent * 1.05, (total, spent)
    assert total >= 0.8 * 2 * known, (shares, known, spent)
    assert total >= 0.6 * spent, (shares, spent)  # the spans cover the work: little of it is left unassigned


def test_the_apportioning_rule_on_known_samples(tmp_path: Path) -> None:
    """A process using one full core from t=0 to t=1 (samples every 0.1 s): a call alone over
    all of it gets 1 s; with a second call over its second half, that half is split by time."""
    from policyc.audit.cgroup_cpu import CgroupCpuMeter, _Watched

    meter = CgroupCpuMeter(interval=0.1, root=tmp_path)
    w = _Watched(tmp_path)
    w.times.extend(1000 + i / 10 for i in range(11))
    w.usage.extend(i / 10 for i in range(11))
    meter._by_endpoint["127.0.0.1:1"] = w
    assert meter.note("127.0.0.1:1", 1000.0, 1001.0, "a")
    assert meter.apportion("127.0.0.1:1", 1000.0, 1001.0, "a") == pytest.approx(1.0)
    assert meter.apportion("127.0.0.1:1", 1000.0, 1000.25, "a") == pytest.approx(0.25)  # part of an interval: by time
    assert meter.note("127.0.0.1:1", 1000.5, 1001.0, "b")
    a = meter.apportion("127.0.0.1:1", 1000.0, 1001.0, "a")
    b = meter.apportion("127.0.0.1:1", 1000.5, 1001.0, "b")
    assert a == pytest.approx(0.75) and b == pytest.approx(0.25) and a + b == pytest.approx(1.0)
    assert meter.apportion("127.0.0.1:1", 999.0, 1000.5, "c") is None  # before the first sample: no figure
    assert meter.apportion("127.0.0.1:2", 1000.0, 1001.0, "d") is None  # not watched
    meter._gone(w)  # its cgroup went (a restarted server): the endpoint is looked for anew at its next call
    assert meter.apportion("127.0.0.1:1", 1000.0, 1001.0, "a") is None
    assert not meter.note("127.0.0.1:1", 1001.0, 1002.0, "e") and "127.0.0.1:1" in meter._asked


def test_a_cgroup_is_released_at_stop_and_leftovers_of_dead_servers_reaped() -> None:
    import subprocess

    from policyc.audit.cgroup_cpu import cgroup2_root
    from policyc.modelserver import cgroup_place

    root = cgroup2_root()
    assert root is not None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        path = cgroup_place.place(child.pid)
        assert path is not None and cgroup_of_pid(child.pid) == path
    finally:
        child.kill()
        child.wait()
    assert path.exists() and cgroup_place.reap_stale() >= 1 and not path.exists()  # its process is gone
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        held = cgroup_place.place(live.pid)
        assert held is not None
        cgroup_place.reap_stale()
        assert held.exists()  # a live server's cgroup stays
        cgroup_place.release(held)  # as the launcher does at stop: anything left moves to the parent first
        assert not held.exists() and cgroup_of_pid(live.pid) == root
    finally:
        live.kill()
        live.wait()
