"""Counting rules for matrix-class ops: MatMul, Gemm, Conv, ConvTranspose, Einsum and
their quantised and fused forms. One multiply-accumulate is 2 FLOPs; bias additions
count 1 per output element in the `other` share."""

from __future__ import annotations

import math

from .node_view import NodeView, OpFlops, UnsupportedNode, numel


def _matmul_flops(out_elems: int, k: int) -> int:
    return 2 * out_elems * k


def _matmul(a_index: int, b_index: int):
    def rule(n: NodeView) -> OpFlops:
        a = n.inp(a_index)
        n.inp(b_index)
        k = a[-1] if a else 1
        return OpFlops(matmul=_matmul_flops(numel(n.out()), k))

    return rule


matmul = _matmul(0, 1)
qlinear_matmul = _matmul(0, 3)


def fused_matmul(n: NodeView) -> OpFlops:
    """com.microsoft FusedMatMul: MatMul with optional transposes and an alpha scale."""
    a = n.inp(0)
    n.inp(1)
    k = a[-2] if n.attr("transA", 0) and len(a) >= 2 else a[-1]
    out = numel(n.out())
    scale = out if float(n.attr("alpha", 1.0)) != 1.0 else 0
    return OpFlops(matmul=_matmul_flops(out, k), other=scale)


def gemm(n: NodeView) -> OpFlops:
    a = n.inp(0)
    n.inp(1)
    k = a[0] if n.attr("transA", 0) else a[1]
    out = numel(n.out())
    other = 0
    if float(n.attr("alpha", 1.0)) != 1.0:
        other += out
    if n.has_input(2) and float(n.attr("beta", 1.0)) != 0.0:
        other += out * (2 if float(n.attr("beta", 1.0)) != 1.0 else 1)
    return OpFlops(matmul=_matmul_flops(out, k), other=other)


def _conv(x_index: int, w_index: int, bias_index: int):
    def rule(n: NodeView) -> OpFlops:
        n.inp(x_index)
        w = n.inp(w_index)
        out = numel(n.out())
        macs = out * math.prod(w[1:])  # each output element: Cin/group x kernel MACs
        return OpFlops(matmul=2 * macs, other=out if n.has_input(bias_index) else 0)

    return rule


conv = _conv(0, 1, 2)
conv_integer = _conv(0, 1, 99)
qlinear_conv = _conv(0, 3, 8)


def conv_transpose(n: NodeView) -> OpFlops:
    x = n.inp(0)
    w = n.inp(1)  # [Cin, Cout/group, k...]
    macs = numel(x) * math.prod(w[1:])  # each input element scatters into Cout/group x kernel
    out = numel(n.out())
    return OpFlops(matmul=2 * macs, other=out if n.has_input(2) else 0)


def _einsum_sizes(n: NodeView) -> tuple[dict[str, int], list[str], str]:
    raw = n.attr("equation", "")
    eq = (raw.decode() if isinstance(raw, bytes) else str(raw)).replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    for i, term in enumerate(terms):
        shape = n.inp(i)
        if "..." in term:
            head, _, tail = term.partition("...")
            n_ell = len(shape) - len(head) - len(tail)
            # ellipsis dims align from the right across operands
            letters = list(head) + [f"...{n_ell - j}" for j in range(n_ell)] + list(tail)
        else:
            letters = list(term)
        if len(letters) != len(shape):
            raise UnsupportedNode(f"einsum term `{term}` does not match input {i} of rank {len(shape)}")
        for letter, dim in zip(letters, shape):
            sizes[letter] = max(sizes.get(letter, 1), dim)
    if not rhs and "->" not in eq:  # implicit output: letters appearing once, sorted
        once = [c for c in sorted(set(lhs.replace(",", "").replace(".", ""))) if lhs.count(c) == 1]
        rhs = "".join(once)
    return sizes, terms, rhs


def einsum(n: NodeView) -> OpFlops:
    """Counted as naive evaluation: with n operands, (n-1) multiplies and one add per point
    of the full index space; one operand counts one add per point when it reduces."""
    sizes, terms, rhs = _einsum_sizes(n)
    points = math.prod(sizes.values())
    if len(terms) >= 2:
        return OpFlops(matmul=2 * (len(terms) - 1) * points)
    summed = set(terms[0]) - set(rhs) - {"."}
    return OpFlops(other=points if summed else 0)
