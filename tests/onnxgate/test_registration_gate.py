"""The ONNX gate at registration, and the demo's models passing their own gate.

- Every model file the demo serves passes `policyc validate` (the CLI, exit 0).
- The seed's drift case through a real decision service: a contract declaring what the old
  model counts; the old model registers; the upgraded model that kept that contract counts
  50 % more and is refused at `RegisterInstance` with the gate's message (contract drift,
  the counted and declared FLOPs, the deviation), `FAILED_PRECONDITION`, code E726.
- The recount is cached per model file: registering the same file again counts nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import grpc
import onnx
import pytest

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.matcher import Instance
from policyc.modelserver.model_files import write_model_files
from policyc.onnxgate.contract_metadata import embed_contract
from policyc.onnxgate.count import count_flops
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer
from policyc.onnxgate.registration_check import recount_cache
from policyc.server import convert
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, ServeConfig
from policyc.server.proto import pb_grpc

REPO = Path(__file__).resolve().parents[2]
TOKENS = 128
OLD = TransformerSpec(vocab=256, d_model=64, heads=4, layers=2, d_ff=256, max_len=TOKENS)
UPGRADED = TransformerSpec(vocab=256, d_model=64, heads=4, layers=3, d_ff=256, max_len=TOKENS)
DEMO_SERVED = ("fraud-scorer", "fraud-scorer-lite", "recommender", "clinical-notes")

CONTRACT = """
contract scorer version "1.0.0" {{
  compute {{
    flops_per_request: {flops:.6e} .. {flops:.6e}
    tokens: {tokens}
    precision: fp16
    efficiency: 50 %
  }}
  memory {{
    bandwidth: >= 1 GB/s
    burst: <= 200 ms
  }}
  dependencies {{
    async_callbacks: no
    cuda: >= 12.1
  }}
  slo {{
    latency: <= 200 ms
    allowance: 20 ms
  }}
}}
"""


def _count(spec: TransformerSpec) -> int:
    return count_flops(build_transformer(spec), TOKENS).total()


@pytest.fixture(scope="module")
def drift_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundle, int, int]:
    """A bundle whose contract `scorer` declares (a point interval) two thirds of what the
    upgraded model counts: the upgraded model drifts +50 %, the old one is within 15 %."""
    upgraded = _count(UPGRADED)
    declared = upgraded / 1.5
    old = _count(OLD)
    assert abs(old - declared) / declared < 0.15, "the old model must fit the contract"
    d = tmp_path_factory.mktemp("drift-policies")
    (d / "scorer.contract").write_text(CONTRACT.format(flops=declared, tokens=TOKENS))
    r = compile_paths([str(d), str(REPO / "policies" / "gpu-catalog.contract")], analyse=False)
    assert r.ok and r.bundle is not None, r
    return r.bundle, old, upgraded


@pytest.fixture(scope="module")
def service(drift_case: tuple[Bundle, int, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    bundle = drift_case[0]
    audit = tmp_path_factory.mktemp("audit") / "audit.db"
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=4, gpus_per_host=2, hosts_per_rack=4),
                                                         audit_log=audit, start_refresher=False)))
    th.start()
    yield th
    th.stop()


def _register(th: ServerThread, iid: str, model: onnx.ModelProto) -> object:
    server = th.server
    assert server.cluster is not None
    slot = next(iter(server.cluster.gpu_slots()))
    inst = Instance(id=iid, model="", deployment=slot.to_deployment())
    with operator_channel(f"127.0.0.1:{server.port}") as ch:
        return pb_grpc.DecisionsStub(ch).RegisterInstance(
            convert.register_request(inst, onnx_model=model.SerializeToString()), timeout=60)


def test_demo_models_pass_policyc_validate(tmp_path: Path) -> None:
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    files = []
    for name in DEMO_SERVED:
        c = r.bundle.contract(name)
        assert c is not None
        f = write_model_files(c, tmp_path, simplified=name == "fraud-scorer-lite")  # the backup serves both variants
        files += [f.full] + ([f.simplified] if f.simplified else [])
    for path in files:
        p = subprocess.run([sys.executable, "-m", "policyc.cli.main", "validate", str(path), "--format", "json"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (path.name, p.stdout, p.stderr)
        out = json.loads(p.stdout)
        assert out["verdict"] == "pass" and out["counted_flops"] > 0, out


def test_old_model_registers_and_upgraded_one_is_refused_with_the_gates_message(
        service: ServerThread, drift_case: tuple[Bundle, int, int]) -> None:
    bundle, old_count, upgraded_count = drift_case
    contract = bundle.contract("scorer")
    assert contract is not None
    reply = _register(service, "scorer-old", embed_contract(build_transformer(OLD), contract))
    assert reply.model == "scorer"  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as info:
        _register(service, "scorer-upgraded", embed_contract(build_transformer(UPGRADED), contract))
    e = info.value
    assert e.code() is grpc.StatusCode.FAILED_PRECONDITION
    details = e.details() or ""
    assert "contract drift in `scorer`" in details and f"counted {upgraded_count:.4g} FLOPs per request at {TOKENS} tokens" in details
    assert "+50.0% outside the interval, tolerance 15%" in details, details
    assert dict(e.trailing_metadata() or ()).get("policyc-field") == "compute.flops"
    assert "scorer-upgraded" not in service.server.state.registry and "scorer-old" in service.server.state.registry


def test_recount_is_cached_per_model_file(service: ServerThread, drift_case: tuple[Bundle, int, int]) -> None:
    contract = drift_case[0].contract("scorer")
    assert contract is not None
    model = embed_contract(build_transformer(OLD, seed=7), contract)
    _register(service, "scorer-a", model)
    counted = recount_cache().counts
    _register(service, "scorer-b", model)  # the same file: served from the cache
    assert recount_cache().counts == counted
