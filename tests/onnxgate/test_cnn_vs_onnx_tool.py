"""The CNN graphs shipped in the onnx wheel, counted and cross-checked with onnx-tool.

onnx-tool reports MACs and weights some ops by their CPU cost, so the comparison is made
on like-for-like terms, per node: for matrix-class ops (Conv, Gemm) onnx-tool's MACs are
our multiply-accumulates plus the bias additions; for pooling, ReLU and element-wise sums
both give one operation per element. Two families differ by design and are compared
apart: BatchNormalization (onnx-tool ~31 MAC-equivalents per element for sqrt and divide,
we count the 4 arithmetic operations of the inference formula) and Softmax (onnx-tool
weights exp; we count 5 operations per element). GlobalAveragePool differs by one divide
per output in onnx-tool.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_tool
import pytest

from policyc.onnxgate import Convention, count_flops

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx"))
CONVENTION_DIFFERS = {"BatchNormalization", "Softmax", "GlobalAveragePool"}


def _onnx_tool_macs(path: Path) -> dict[str, tuple[str, float]]:
    m = onnx_tool.Model(str(path))
    m.graph.shape_infer(None)
    m.graph.profile()
    return {name: (node.op_type, float(node.macs[0])) for name, node in m.graph.nodemap.items()}


def test_the_wheel_ships_the_expected_networks() -> None:
    assert {"resnet50", "densenet121", "inception_v1", "inception_v2", "vgg19"} <= set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_counts_agree_with_onnx_tool(name: str) -> None:
    path = LIGHT / f"light_{name}.onnx"
    ours = {n.name: n for n in count_flops(onnx.load(str(path)), 1).nodes}
    # the unnamed weight generators (ConstantOfShape) cost nothing in either count
    everything = _onnx_tool_macs(path)
    tool = {k: v for k, v in everything.items() if v[0] != "ConstantOfShape"}
    assert all(v[1] == 0 for v in everything.values() if v[0] == "ConstantOfShape")
    assert set(tool) <= set(ours)
    assert all(ours[k].total() == 0 for k in set(ours) - set(tool))
    # matrix-class ops: exact agreement per node, MACs + bias
    for node_name, (op, macs) in tool.items():
        if op in ("Conv", "Gemm", "MatMul"):
            mine = ours[node_name]
            assert mine.flops.matmul // 2 + mine.flops.other == pytest.approx(macs, rel=1e-9), node_name
    # whole model, on the ops both count the same way: within 5 %
    same = [k for k, (op, _) in tool.items() if op not in CONVENTION_DIFFERS]
    ours_same = sum(ours[k].flops.matmul // 2 + ours[k].flops.other for k in same)
    tool_same = sum(tool[k][1] for k in same)
    assert abs(ours_same - tool_same) / tool_same < 0.05
    # and the matrix-class total, the figure a scheduler provisions for, within 5 % as well
    tool_matrix = sum(m for op, m in tool.values() if op in ("Conv", "Gemm", "MatMul"))
    ours_matrix = sum(n.total(Convention.MATMUL) // 2 for n in ours.values())
    assert abs(ours_matrix - tool_matrix) / tool_matrix < 0.05
