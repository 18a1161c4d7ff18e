"""Embedding a contract in a model and loading it back, with precise errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from policyc.onnxgate import CONTRACT_KEY, HASH_KEY, ContractMetadataError, embed_contract, load_contract
from policyc.onnxgate.contract_metadata import canonical_json, contract_hash


def _with_props(model: onnx.ModelProto, props: dict[str, str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.metadata_props[:]
    for k, v in props.items():
        out.metadata_props.add(key=k, value=v)
    return out


def _props(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def test_round_trip_keeps_other_props_and_model_stays_valid(small_model, contract_factory, write_model) -> None:
    contract = contract_factory(1e9, 2e9)
    base = _with_props(small_model, {"author": "ml-team", "license": "apache-2.0"})
    out = embed_contract(base, contract)
    onnx.checker.check_model(out, full_check=True)  # also rejects duplicate keys
    props = _props(out)
    assert props["author"] == "ml-team" and props["license"] == "apache-2.0"
    assert props[CONTRACT_KEY] == json.dumps(json.loads(props[CONTRACT_KEY]), sort_keys=True, separators=(",", ":"))
    assert props[HASH_KEY] == contract_hash(props[CONTRACT_KEY])
    path = write_model(out)
    assert load_contract(path) == contract
    assert load_contract(path.read_bytes()) == contract
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"input_ids": np.zeros((1, 8), np.int64)})[0].shape == (1, 8, 500)


def test_embedding_twice_replaces_instead_of_duplicating(small_model, contract_factory) -> None:
    once = embed_contract(small_model, contract_factory(1e9, 2e9))
    twice = embed_contract(once, contract_factory(3e9, 4e9))
    keys = [p.key for p in twice.metadata_props]
    assert keys.count(CONTRACT_KEY) == 1 and keys.count(HASH_KEY) == 1
    assert load_contract(twice.SerializeToString()).compute.flops.lo == 3e9


def test_survives_shape_inference(small_model, contract_factory) -> None:
    out = onnx.shape_inference.infer_shapes(embed_contract(small_model, contract_factory(1e9, 2e9)))
    assert load_contract(out.SerializeToString()).name == "fraud-scorer"


def _embed_raw(model: onnx.ModelProto, raw: dict) -> bytes:
    text = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    return _with_props(model, {CONTRACT_KEY: text, HASH_KEY: contract_hash(text)}).SerializeToString()


def _raw(contract) -> dict:
    return json.loads(canonical_json(contract))


@pytest.mark.parametrize("section", ["compute", "memory", "dependencies"])
def test_missing_required_section_is_named(small_model, contract_factory, section: str) -> None:
    raw = _raw(contract_factory(1e9, 2e9))
    del raw[section]
    with pytest.raises(ContractMetadataError) as e:
        load_contract(_embed_raw(small_model, raw))
    assert e.value.field == section
    assert f"missing required section `{section}`" in str(e.value)


def test_missing_nested_field_is_named(small_model, contract_factory) -> None:
    raw = _raw(contract_factory(1e9, 2e9))
    del raw["memory"]["bandwidth_min"]
    with pytest.raises(ContractMetadataError) as e:
        load_contract(_embed_raw(small_model, raw))
    assert e.value.field == "memory.bandwidth_min"
    assert "missing required field `memory.bandwidth_min`" in str(e.value)


def test_bad_value_is_named(small_model, contract_factory) -> None:
    raw = _raw(contract_factory(1e9, 2e9))
    raw["compute"]["per"] = "minute"
    with pytest.raises(ContractMetadataError) as e:
        load_contract(_embed_raw(small_model, raw))
    assert e.value.field == "compute.per" and "does not match the schema at `compute.per`" in str(e.value)


def test_upside_down_interval_is_named(small_model, contract_factory) -> None:
    raw = _raw(contract_factory(1e9, 2e9))
    raw["compute"]["flops"] = {"lo": 3e9, "hi": 1e9}
    with pytest.raises(ContractMetadataError, match=r"bad `compute.flops`: FLOPs interval is empty") as e:
        load_contract(_embed_raw(small_model, raw))
    assert e.value.field == "compute.flops"


def test_corrupted_value_fails_the_hash(small_model, contract_factory) -> None:
    good = embed_contract(small_model, contract_factory(1.2e12, 1.2e12))
    props = _props(good)
    props[CONTRACT_KEY] = props[CONTRACT_KEY].replace("1200000000000.0", "1800000000000.0")
    with pytest.raises(ContractMetadataError, match=r"does not match `policyc.contract.sha256`.*modified or corrupted") as e:
        load_contract(_with_props(good, props).SerializeToString())
    assert e.value.field == CONTRACT_KEY


def test_truncated_json_is_reported_as_json(small_model) -> None:
    text = '{"name": "x", "compute": '
    data = _with_props(small_model, {CONTRACT_KEY: text, HASH_KEY: contract_hash(text)}).SerializeToString()
    with pytest.raises(ContractMetadataError, match=r"`policyc.contract` is not valid JSON at column 26"):
        load_contract(data)


def test_missing_hash_and_missing_contract(small_model, contract_factory) -> None:
    with pytest.raises(ContractMetadataError, match=r"no embedded contract: metadata `policyc.contract` is missing"):
        load_contract(small_model.SerializeToString())
    text = canonical_json(contract_factory(1e9, 2e9))
    with pytest.raises(ContractMetadataError, match=r"`policyc.contract.sha256` is missing") as e:
        load_contract(_with_props(small_model, {CONTRACT_KEY: text}).SerializeToString())
    assert e.value.field == HASH_KEY


@pytest.mark.parametrize(
    "content, why",
    [
        (b"contract fraud-scorer { compute { } }\n", "not an ONNX model"),
        (b"", "not an ONNX model"),
        (bytes(range(256)) * 4, "not an ONNX model"),
    ],
    ids=["text", "empty", "binary"],
)
def test_non_onnx_files_give_a_precise_error(tmp_path, content: bytes, why: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ContractMetadataError, match=why) as e:
        load_contract(path)
    assert e.value.field == "model" and str(path) in str(e.value)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ContractMetadataError, match=r"no such file"):
        load_contract(tmp_path / "absent.onnx")
