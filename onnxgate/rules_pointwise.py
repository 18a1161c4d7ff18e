"""Counting rules for element-wise, normalisation, softmax, pooling and reduction ops.

Convention (one FLOP = one elementary arithmetic operation or one elementary function
evaluation such as exp, erf, tanh, sqrt; comparisons count 1): an element-wise op costs
its standard decomposition per output element; a normalisation costs per element of its
input (per-row terms such as the variance's rsqrt are O(rows) and omitted); a window op
costs one operation per window element per output; a reduction one per input element.
Ops are counted as written, not as a runtime might fuse them.
"""

from __future__ import annotations

import math
from typing import Final

from .node_view import NodeView, OpFlops, numel

SOFTMAX_COST: Final = 5  # max, subtract, exp, sum, divide

# FLOPs per output element.
ELEMENTWISE_COST: Final[dict[str, int]] = {
    # arithmetic and elementary functions
    "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Pow": 1, "Mod": 1, "Neg": 1, "Abs": 1,
    "Reciprocal": 1, "Sqrt": 1, "Exp": 1, "Log": 1, "Erf": 1, "Tanh": 1, "Sin": 1, "Cos": 1,
    "Tan": 1, "Asin": 1, "Acos": 1, "Atan": 1, "Sinh": 1, "Cosh": 1, "Asinh": 1, "Acosh": 1,
    "Atanh": 1, "Floor": 1, "Ceil": 1, "Round": 1, "Sign": 1, "Relu": 1,
    # comparisons and logic
    "Equal": 1, "Less": 1, "Greater": 1, "LessOrEqual": 1, "GreaterOrEqual": 1, "Not": 1,
    "And": 1, "Or": 1, "Xor": 1, "IsNaN": 1, "IsInf": 1, "BitwiseAnd": 1, "BitwiseOr": 1,
    "BitwiseXor": 1, "BitwiseNot": 1, "BitShift": 1,
    # composite activations: their standard decomposition
    "Clip": 2,  # max, min
    "LeakyRelu": 2, "PRelu": 2, "ThresholdedRelu": 2, "Shrink": 2,  # compare, multiply
    "Elu": 3, "Celu": 3, "Selu": 4,  # compare, exp, subtract (+ scale)
    "Sigmoid": 4,  # negate, exp, add, divide
    "HardSigmoid": 3, "HardSwish": 4,  # multiply, add, clip (+ multiply)
    "Softplus": 3, "Softsign": 3,  # exp, add, log / abs, add, divide
    "Mish": 5,  # softplus (3), tanh, multiply
    "Swish": 5,  # x * sigmoid(alpha x)
    "Gelu": 5,  # exact: divide, erf, add, multiply, multiply (tanh form: 9, see below)
    "QuantizeLinear": 2, "DequantizeLinear": 2,  # scale, shift
}

# com.microsoft element-wise fusions.
CONTRIB_ELEMENTWISE_COST: Final[dict[str, int]] = {
    "Gelu": 5,
    "BiasGelu": 6,  # bias add + exact gelu
    "FastGelu": 9,  # tanh approximation; +1 with bias
    "QuickGelu": 6,  # x * sigmoid(1.702 x)
    "BiasAdd": 2,  # x + bias + skip
}

NORMALISATION_COST: Final[dict[str, int]] = {
    # per input element: mean add, subtract, square, variance add, multiply by rstd, scale
    # (+1 shift when a bias is given)
    "LayerNormalization": 6,
    "InstanceNormalization": 7,
    "GroupNormalization": 7,
    "MeanVarianceNormalization": 5,
    "RMSNormalization": 4,  # square, add, multiply by rstd, scale
    "SimplifiedLayerNormalization": 4,
    "BatchNormalization": 4,  # subtract mean, multiply by 1/std, scale, shift
}


def elementwise(cost: int, *, variadic: bool = False):
    def rule(n: NodeView) -> OpFlops:
        out = numel(n.out())
        if variadic:  # Sum / Max / Min / Mean over k inputs: k-1 ops (Mean: +1 divide)
            k = sum(1 for i in range(len(n.input_names)) if n.has_input(i))
            return OpFlops(other=out * max(k - 1, 0) + (out if n.op_type == "Mean" else 0))
        if n.op_type == "Gelu" and n.attr("approximate", "none") in ("tanh", b"tanh"):
            return OpFlops(other=9 * out)
        return OpFlops(other=cost * out)

    return rule


def fast_gelu(n: NodeView) -> OpFlops:
    return OpFlops(other=numel(n.out()) * (10 if n.has_input(1) else 9))


def normalisation(cost: int):
    def rule(n: NodeView) -> OpFlops:
        x = numel(n.inp(0))
        shift = 0
        if n.op_type == "LayerNormalization" and n.has_input(2):
            shift = x
        return OpFlops(other=cost * x + shift)

    return rule


def skip_layer_norm(simplified: bool):
    """com.microsoft Skip(Simplified)LayerNormalization: x + skip (+ bias), then the norm."""

    def rule(n: NodeView) -> OpFlops:
        x = numel(n.inp(0))
        n.inp(1)
        cost = 1 + (4 if simplified else 6)
        if not simplified and n.has_input(3):
            cost += 1  # beta
        bias_index = 3 if simplified else 4
        if n.has_input(bias_index):
            cost += 1
        return OpFlops(other=cost * x)

    return rule


def softmax(n: NodeView) -> OpFlops:
    return OpFlops(other=SOFTMAX_COST * numel(n.inp(0)))


def hardmax(n: NodeView) -> OpFlops:
    return OpFlops(other=numel(n.inp(0)))


def lrn(n: NodeView) -> OpFlops:
    """Square and add over `size` channels, then scale, add bias, pow, divide."""
    size = int(n.attr("size", 1))
    return OpFlops(other=numel(n.inp(0)) * (2 * size + 4))


def window_pool(per_window_element: int):
    def rule(n: NodeView) -> OpFlops:
        n.inp(0)
        kernel = n.attr("kernel_shape")
        if not kernel:
            from .node_view import UnsupportedNode

            raise UnsupportedNode("attribute `kernel_shape` is missing")
        return OpFlops(other=per_window_element * numel(n.out()) * math.prod(int(k) for k in kernel))

    return rule


def per_input_element(cost: int):
    def rule(n: NodeView) -> OpFlops:
        return OpFlops(other=cost * numel(n.inp(0)))

    return rule
