"""RegisterInstance / DeregisterInstance: inline contracts, ONNX models (including refused
ones naming the missing field), contract drift, admission, duplicates."""

from __future__ import annotations

import json

import grpc
import pytest

from policyc.matcher import Instance
from policyc.modelserver.model_files import build_variant
from policyc.modelserver.wire import SIMPLIFIED
from policyc.onnxgate.contract_metadata import CONTRACT_KEY, HASH_KEY, canonical_json, contract_hash, embed_contract
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer
from policyc.server import convert
from policyc.server.proto import pb

MODEL = build_transformer(TransformerSpec(vocab=100, d_model=16, heads=2, layers=1, d_ff=32, max_len=32))


def _slot(served, contract):  # type: ignore[no-untyped-def]
    return next(s for s in served.server.cluster.gpu_slots()
                if all(getattr(s, a) for a in contract.security) and (not contract.regions or s.region in contract.regions)
                and s.gpu_model in ("H100", "H200", "A100-80G"))


def _inst(served, bundle, iid: str, model: str = "fraud-scorer-lite") -> Instance:  # type: ignore[no-untyped-def]
    return Instance(id=iid, model=model, deployment=_slot(served, bundle.contract(model)).to_deployment())


def _refused(stub, req) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        stub.RegisterInstance(req)
    return info.value


def test_register_by_name_then_deregister(stub, served, bundle) -> None:
    n = len(served.server.state.registry)
    r = stub.RegisterInstance(convert.register_request(_inst(served, bundle, "reg-by-name")))
    assert r.registry_size == n + 1 and r.model == "fraud-scorer-lite" and r.bundle_hash == bundle.content_hash
    d = stub.Decide(pb.DecideRequest(headers={"X-Model": "fraud-scorer-lite"}))
    assert d.outcome == pb.ADMITTED
    assert stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id="reg-by-name")).registry_size == n
    with pytest.raises(grpc.RpcError) as info:
        stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id="reg-by-name"))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND and "no instance `reg-by-name`" in info.value.details()


def test_inline_contract_must_be_the_bundles(stub, served, bundle) -> None:
    c = bundle.contract("fraud-scorer-lite")
    inst = _inst(served, bundle, "inline-ok").model_copy(update={"model": ""})
    r = stub.RegisterInstance(convert.register_request(inst, contract_json=canonical_json(c)))
    assert r.model == "fraud-scorer-lite"
    drifted = c.model_copy(update={"compute": c.compute.model_copy(update={"flops": c.compute.flops.model_copy(update={"hi": 9e11})})})
    e = _refused(stub, convert.register_request(inst.model_copy(update={"id": "inline-drift"}), contract_json=canonical_json(drifted)))
    assert e.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "contract drift" in e.details() and "`compute.flops.hi`" in e.details()
    e = _refused(stub, convert.register_request(inst.model_copy(update={"id": "inline-bad"}), contract_json="{nope"))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "not JSON" in e.details()


def test_onnx_model_with_embedded_contract_registers(stub, served, bundle) -> None:
    # the served simplified network: its counted cost is within the lite contract (the gate recounts at registration)
    onnx_bytes = build_variant(bundle.contract("fraud-scorer-lite"), SIMPLIFIED).SerializeToString()
    inst = _inst(served, bundle, "onnx-ok").model_copy(update={"model": ""})
    r = stub.RegisterInstance(convert.register_request(inst, onnx_model=onnx_bytes))
    assert r.model == "fraud-scorer-lite" and "onnx-ok" in served.server.state.registry


@pytest.mark.parametrize("section", ["memory", "compute"])
def test_onnx_model_missing_a_required_field_is_refused_naming_it(stub, served, bundle, section: str) -> None:
    c = bundle.contract("fraud-scorer-lite")
    raw = json.loads(canonical_json(c))
    del raw[section]
    text = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    model = embed_contract(MODEL, c)
    for p in model.metadata_props:
        if p.key == CONTRACT_KEY:
            p.value = text
        elif p.key == HASH_KEY:
            p.value = contract_hash(text)
    e = _refused(stub, convert.register_request(_inst(served, bundle, f"onnx-no-{section}"), onnx_model=model.SerializeToString()))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"missing required section `{section}`" in e.details()
    assert dict(e.trailing_metadata())["policyc-field"] == section
    assert f"onnx-no-{section}" not in served.server.state.registry


def test_onnx_without_contract_and_not_onnx_at_all(stub, served, bundle) -> None:
    e = _refused(stub, convert.register_request(_inst(served, bundle, "onnx-bare"), onnx_model=MODEL.SerializeToString()))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and dict(e.trailing_metadata())["policyc-field"] == CONTRACT_KEY
    e = _refused(stub, convert.register_request(_inst(served, bundle, "onnx-junk"), onnx_model=b"not a model"))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and dict(e.trailing_metadata())["policyc-field"] == "model"


def test_admission_unknown_model_duplicate_and_missing_fields(stub, served, bundle) -> None:
    inst = _inst(served, bundle, "adm-1")
    weak = inst.model_copy(update={"deployment": inst.deployment.model_copy(update={"tpm": False})})
    e = _refused(stub, convert.register_request(weak))
    assert e.code() is grpc.StatusCode.FAILED_PRECONDITION and "requires `tpm`" in e.details()
    e = _refused(stub, convert.register_request(inst.model_copy(update={"model": "no-such-model"})))
    assert e.code() is grpc.StatusCode.NOT_FOUND and "unknown model `no-such-model`" in e.details()
    stub.RegisterInstance(convert.register_request(inst))
    e = _refused(stub, convert.register_request(inst))
    assert e.code() is grpc.StatusCode.ALREADY_EXISTS
    e = _refused(stub, pb.RegisterInstanceRequest(id="x", model="fraud-scorer-lite"))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "`deployment` is required" in e.details()
    e = _refused(stub, pb.RegisterInstanceRequest(id="x", model="fraud-scorer-lite", deployment=pb.Deployment(host="h")))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and dict(e.trailing_metadata())["policyc-field"] == "deployment.gpu"
