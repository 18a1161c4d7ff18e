"""The CI gate end to end: drift fails, an honest contract passes, the count fails closed."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

from policyc.cli.main import main
from policyc.onnxgate import CountError, count_flops, embed_contract
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer
from policyc.onnxgate.validate import Verdict, validate_model

# GPT-J-like widths; 22 layers cost ~1.19e12 FLOPs per 128-token request, 34 layers ~1.8e12.
OLD = TransformerSpec(vocab=50400, d_model=4096, heads=16, layers=22, d_ff=16384, max_len=2048)
NEW = TransformerSpec(vocab=50400, d_model=4096, heads=16, layers=34, d_ff=16384, max_len=2048)


@pytest.fixture(scope="module")
def drift_models():
    return build_transformer(OLD, weights="absent"), build_transformer(NEW, weights="absent")


def test_contract_drift_scenario_fails_and_honest_contract_passes(drift_models, contract_factory, write_model) -> None:
    old, new = drift_models
    declared = contract_factory(1.2e12, 1.2e12, tokens=128)
    old_count = count_flops(old, 128).total()
    new_count = count_flops(new, 128).total()
    assert 1.15e12 < old_count < 1.25e12 and 1.75e12 < new_count < 1.85e12
    honest = validate_model(write_model(embed_contract(old, declared), "old.onnx"))
    assert honest.verdict is Verdict.PASS, honest.message
    drifted = validate_model(write_model(embed_contract(new, declared), "new.onnx"))
    assert drifted.verdict is Verdict.DRIFT
    assert drifted.counted == new_count and drifted.deviation == pytest.approx(new_count / 1.2e12 - 1)
    assert "contract drift in `fraud-scorer`" in drifted.message and "tolerance 15%" in drifted.message
    assert drifted.dominant[0].op == "MatMul" and drifted.dominant[0].share > 0.95
    # an updated, honest contract for the upgraded model passes again
    updated = contract_factory(1.7e12, 1.9e12, tokens=128)
    assert validate_model(write_model(embed_contract(new, updated), "new2.onnx")).ok


def test_tolerance_bounds(embedded) -> None:
    probe = validate_model(embedded(1.0, 1.0))  # learn the count at 32 tokens
    counted = probe.counted
    assert probe.verdict is Verdict.DRIFT and counted
    assert validate_model(embedded(counted / 1.149, counted / 1.149)).ok
    assert not validate_model(embedded(counted / 1.151, counted / 1.151)).ok
    assert validate_model(embedded(counted / 1.151, counted / 1.151), tolerance=0.2).ok
    assert not validate_model(embedded(counted * 1.2, counted * 1.3)).ok


def test_per_token_contract_is_scaled_to_the_request(small_model, contract_factory, write_model) -> None:
    per_request = count_flops(small_model, 32).total()
    c = contract_factory(per_request / 32, per_request / 32, tokens=32, per="token")
    assert validate_model(write_model(embed_contract(small_model, c))).ok


def test_run_recounts_executed_nodes(embedded) -> None:
    counted = validate_model(embedded(1.0, 1.0)).counted
    report = validate_model(embedded(counted, counted), run=True)
    assert report.ok and report.run is not None and report.run.ok
    assert report.run.tokens == 100 and report.run.executed_flops == report.run.static_flops > 0


def _one_node_model(node: onnx.NodeProto, inputs, outputs, domains=()) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", inputs, outputs)
    opsets = [helper.make_opsetid("", 21)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets)


def test_op_without_rule_fails_closed() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = _one_node_model(helper.make_node("MysteryMatMul", ["x"], ["y"], name="mystery", domain="acme.ops"), [x], [y], ["acme.ops"])
    with pytest.raises(CountError, match=r"node `mystery` \(MysteryMatMul\): op `MysteryMatMul` in domain `acme.ops` has no counting rule"):
        count_flops(model, 16)


def test_unresolved_shape_fails_closed() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)  # no shape at all
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = _one_node_model(helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), [x, w], [y])
    with pytest.raises(CountError, match=r"node `mm` \(MatMul\): shape of input 0 `x` is unresolved"):
        count_flops(model, 16)


def test_control_flow_fails_closed() -> None:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])],
    )
    loop = helper.make_node("Loop", ["m", "c"], [], name="loop", body=body)
    inputs = [helper.make_tensor_value_info("m", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    model = _one_node_model(loop, inputs, [])
    with pytest.raises(CountError, match=r"node `loop` \(Loop\): op `Loop` has no counting rule"):
        count_flops(model, 4)


# ------------------------------------------------------------------ the CLI


def test_cli_validate_exit_codes_and_json(embedded, capsys, tmp_path) -> None:
    counted = validate_model(embedded(1.0, 1.0)).counted
    good = embedded(counted, counted)
    assert main(["validate", str(good)]) == 0
    assert "ok: " in capsys.readouterr().out
    bad = embedded(counted * 2, counted * 2)
    assert main(["validate", str(bad), "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "drift" and out["counted_flops"] == counted and out["declared_flops"]["lo"] == counted * 2
    assert out["dominant_ops"][0]["op"] == "MatMul"
    junk = tmp_path / "junk.onnx"
    junk.write_text("not a model")
    assert main(["validate", str(junk)]) == 1
    assert "not an ONNX model" in capsys.readouterr().out
    assert main(["validate", str(good), "--tolerance", "-1"]) == 2
    assert main(["validate", str(good), "--dim", "sequence"]) == 2


def test_cli_embed_compiles_a_contract_source(small_model, write_model, tmp_path, capsys) -> None:
    counted = count_flops(small_model, 32).total()
    src = tmp_path / "x.contract"
    src.write_text(
        'contract fraud-scorer version "2.3.0" {\n'
        f"  compute {{\n    flops_per_request: {counted * 0.95:.6e} FLOP .. {counted * 1.05:.6e} FLOP\n    tokens: 32\n  }}\n"
        "  memory {\n    bandwidth: >= 80 GB/s\n    burst: <= 200 ms\n  }\n"
        "  dependencies {\n    service cache { kind: redis  p99: <= 5 ms }\n    async_callbacks: false\n    cuda: >= 12.1\n  }\n"
        "}\n"
    )
    model = write_model(small_model)
    out = tmp_path / "out.onnx"
    rc = main(["embed", str(model), "--contract", str(src), "--name", "fraud-scorer", "-o", str(out)])
    assert rc == 0, capsys.readouterr()
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    assert main(["validate", str(out), "--run"]) == 0
    assert main(["embed", str(model), "--contract", str(src), "--name", "nope", "-o", str(out)]) == 1
    assert "no contract named `nope` (contracts found: `fraud-scorer`)" in capsys.readouterr().err
