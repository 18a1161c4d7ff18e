"""Which rule counts which op, and which ops are not compute at all.

An op found in neither table has no counting rule and stops the count (fail closed):
adding support for an op is adding one line here, with its convention documented in the
rule's module. Zero-cost ops move, reshape, select or create data without arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from . import rules_attention as att
from . import rules_linear as lin
from . import rules_pointwise as pw
from .node_view import NodeView, OpFlops

Rule = Callable[[NodeView], OpFlops]
ONNX: Final = ""
MS: Final = "com.microsoft"

ZERO_COST_OPS: Final[frozenset[str]] = frozenset(
    {
        "Reshape", "Transpose", "Concat", "Gather", "GatherElements", "GatherND", "Slice",
        "Squeeze", "Unsqueeze", "Shape", "Size", "Constant", "ConstantOfShape", "Identity",
        "Dropout", "Cast", "CastLike", "Expand", "Split", "Pad", "Flatten", "Tile", "Range",
        "Trilu", "ScatterND", "ScatterElements", "Scatter", "DepthToSpace", "SpaceToDepth",
        "NonZero", "OneHot", "EyeLike", "Compress", "ReverseSequence", "Where", "Col2Im",
        "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
        "SequenceConstruct", "SequenceAt", "SequenceEmpty", "SequenceInsert", "SequenceLength",
        "ConcatFromSequence", "SplitToSequence", "Optional", "OptionalGetElement",
        "OptionalHasElement", "NonMaxSuppression", "MaxRoiPool", "ImageDecoder",
    }
)

RULES: Final[dict[tuple[str, str], Rule]] = {
    (ONNX, "MatMul"): lin.matmul,
    (ONNX, "MatMulInteger"): lin.matmul,
    (ONNX, "QLinearMatMul"): lin.qlinear_matmul,
    (ONNX, "Gemm"): lin.gemm,
    (ONNX, "Conv"): lin.conv,
    (ONNX, "ConvInteger"): lin.conv_integer,
    (ONNX, "QLinearConv"): lin.qlinear_conv,
    (ONNX, "ConvTranspose"): lin.conv_transpose,
    (ONNX, "Einsum"): lin.einsum,
    (ONNX, "Attention"): att.onnx_attention,
    (ONNX, "Softmax"): pw.softmax,
    (ONNX, "LogSoftmax"): pw.softmax,
    (ONNX, "Hardmax"): pw.hardmax,
    (ONNX, "LRN"): pw.lrn,
    (ONNX, "MaxPool"): pw.window_pool(1),
    (ONNX, "AveragePool"): pw.window_pool(1),
    (ONNX, "LpPool"): pw.window_pool(2),
    (ONNX, "GlobalAveragePool"): pw.per_input_element(1),
    (ONNX, "GlobalMaxPool"): pw.per_input_element(1),
    (ONNX, "GlobalLpPool"): pw.per_input_element(2),
    (ONNX, "CumSum"): pw.per_input_element(1),
    (ONNX, "TopK"): pw.per_input_element(1),
    (ONNX, "ArgMax"): pw.per_input_element(1),
    (ONNX, "ArgMin"): pw.per_input_element(1),
    (ONNX, "DynamicQuantizeLinear"): pw.per_input_element(4),
    (MS, "FusedMatMul"): lin.fused_matmul,
    (MS, "Attention"): att.contrib_attention,
    (MS, "MultiHeadAttention"): att.contrib_multihead_attention,
    (MS, "FastGelu"): pw.fast_gelu,
    (MS, "SkipLayerNormalization"): pw.skip_layer_norm(simplified=False),
    (MS, "SkipSimplifiedLayerNormalization"): pw.skip_layer_norm(simplified=True),
    (MS, "SimplifiedLayerNormalization"): pw.normalisation(4),
    (MS, "LayerNormalization"): pw.normalisation(6),
}

for _op, _cost in pw.ELEMENTWISE_COST.items():
    RULES[(ONNX, _op)] = pw.elementwise(_cost)
for _op in ("Sum", "Max", "Min", "Mean"):
    RULES[(ONNX, _op)] = pw.elementwise(1, variadic=True)
for _op, _cost in pw.CONTRIB_ELEMENTWISE_COST.items():
    RULES.setdefault((MS, _op), pw.elementwise(_cost))
for _op, _cost in pw.NORMALISATION_COST.items():
    RULES[(ONNX, _op)] = pw.normalisation(_cost)
for _op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1"):
    RULES[(ONNX, _op)] = pw.per_input_element(1)
for _op in ("ReduceSumSquare", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"):
    RULES[(ONNX, _op)] = pw.per_input_element(2)


def normalise_domain(domain: str) -> str:
    return ONNX if domain in ("", "ai.onnx") else domain


def is_zero_cost(domain: str, op_type: str) -> bool:
    return normalise_domain(domain) == ONNX and op_type in ZERO_COST_OPS


def rule_for(domain: str, op_type: str) -> Rule | None:
    return RULES.get((normalise_domain(domain), op_type))
