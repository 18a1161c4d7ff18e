"""A graph output that constant folding resolves (the model returns its own input shape, a
small `Range`, a `Constant`…) is kept as a `Constant` node: counting such a model once
raised `TypeError: does not support assignment` from `with_constants` (a protobuf repeated
field given a slice), a traceback out of `policyc validate`. The hostile variants (fold
bombs at small sizes) are in tests/adversarial/cases/onnx; here each shape of the problem
is counted, validated through the CLI, and its folded output checked."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from policyc.cli.main import main
from policyc.onnxgate import count_flops, embed_contract
from policyc.onnxgate.fold_shapes import with_constants

MATMUL_FLOPS = 2 * 1 * 128 * 64 * 64  # X[1, 128, 64] @ W[64, 64] at the contract's 128 tokens


def _const(name: str, value: object) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))


EXTRA_OUTPUT: dict[str, list[onnx.NodeProto]] = {
    "own-shape": [helper.make_node("Shape", ["X"], ["Z"])],
    "own-size": [helper.make_node("Size", ["X"], ["Z"])],
    "constant": [_const("Z", [1, 2, 3])],
    "small-range": [_const("s", 0), _const("l", 10), _const("d", 1), helper.make_node("Range", ["s", "l", "d"], ["Z"])],
    "shape-arithmetic": [helper.make_node("Shape", ["X"], ["sh"]), _const("two", 2),
                         helper.make_node("Mul", ["sh", "two"], ["Z"])],
}


def _model(extra: list[onnx.NodeProto]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, "tokens", 64])
    outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None), helper.make_tensor_value_info("Z", TensorProto.INT64, None)]
    w = numpy_helper.from_array(np.ones((64, 64), dtype=np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"]), *extra], "folded-output", [x], outs, [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("kind", sorted(EXTRA_OUTPUT))
def test_a_folded_graph_output_is_counted_and_validated(kind: str, contract_factory, write_model, capsys) -> None:
    model = _model(EXTRA_OUTPUT[kind])
    assert MATMUL_FLOPS <= count_flops(model, 128).total() <= MATMUL_FLOPS + 16  # + the shape arithmetic's few
    honest = write_model(embed_contract(model, contract_factory(MATMUL_FLOPS, MATMUL_FLOPS)), f"{kind}.onnx")
    assert main(["validate", str(honest)]) == 0
    drifted = write_model(embed_contract(model, contract_factory(1e12, 2e12)), f"{kind}-drift.onnx")
    assert main(["validate", str(drifted)]) == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and f"{kind}-drift.onnx" in out.out + out.err


def test_with_constants_keeps_a_folded_output_as_a_constant_node() -> None:
    model = _model(EXTRA_OUTPUT["own-shape"])
    folded = with_constants(model, {"Z": np.array([1, 128, 64], dtype=np.int64)})
    assert "Z" not in {i.name for i in folded.graph.initializer}
    (node,) = [n for n in folded.graph.node if "Z" in n.output]
    assert node.op_type == "Constant"
    assert numpy_helper.to_array(node.attribute[0].t).tolist() == [1, 128, 64]
