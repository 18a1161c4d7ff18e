"""Counting rules for attention ops: the ONNX `Attention` op (opset 23) and onnxruntime's
fused `com.microsoft` `Attention` and `MultiHeadAttention`.

Per query-key score: the two batched products (Q·Kᵀ and P·V) are matrix-class work; the
scale (1), the mask or causal bias (1, when present), a softcap (3: divide, tanh,
multiply) and the softmax (5: max, subtract, exp, sum, divide) are `other`. Projections a
fused op performs (contrib `Attention`'s QKV weight) count as MatMul plus bias.
"""

from __future__ import annotations

from .node_view import NodeView, OpFlops, UnsupportedNode, numel
from .rules_pointwise import SOFTMAX_COST


def _core(batch: int, heads: int, sq: int, skv: int, dqk: int, dv: int, *, masked: bool, softcap: bool = False) -> OpFlops:
    scores = batch * heads * sq * skv
    matmul = 2 * scores * dqk + 2 * scores * dv
    other = scores * (1 + (1 if masked else 0) + (3 if softcap else 0) + SOFTMAX_COST)
    return OpFlops(matmul=matmul, other=other)


def onnx_attention(n: NodeView) -> OpFlops:
    q, k, v = n.inp(0), n.inp(1), n.inp(2)
    if len(q) == 4:
        b, hq, sq, dqk = q
        skv, dv = k[2], v[3]
    elif len(q) == 3:
        hq = int(n.attr("q_num_heads", 0))
        hkv = int(n.attr("kv_num_heads", 0))
        if hq <= 0 or hkv <= 0:
            raise UnsupportedNode("3-D inputs need `q_num_heads` and `kv_num_heads`")
        b, sq, qh = q
        dqk, skv, dv = qh // hq, k[1], v[2] // hkv
    else:
        raise UnsupportedNode(f"query of rank {len(q)}; expected 3 or 4")
    if n.has_input(4):  # past_key: [B, Hkv, S_past, D]
        skv += n.inp(4)[2]
    masked = n.has_input(3) or bool(n.attr("is_causal", 0))
    return _core(b, hq, sq, skv, dqk, dv, masked=masked, softcap=float(n.attr("softcap", 0.0)) != 0.0)


def _contrib_sizes(n: NodeView, width: int) -> tuple[int, int, int]:
    sizes = n.attr("qkv_hidden_sizes")
    if sizes:
        dq, dk, dv = (int(x) for x in sizes)
    else:
        dq = dk = dv = width // 3
    return dq, dk, dv


def contrib_attention(n: NodeView) -> OpFlops:
    """com.microsoft Attention: input [B,S,Din] x weights [Din, Dq+Dk+Dv] (+ bias)."""
    x, w = n.inp(0), n.inp(1)
    if len(x) != 3 or len(w) != 2:
        raise UnsupportedNode("expected input [batch, seq, hidden] and weights [hidden, 3*hidden]")
    b, s, din = x
    heads = int(n.attr("num_heads", 0))
    if heads <= 0:
        raise UnsupportedNode("attribute `num_heads` is missing")
    dq, dk, dv = _contrib_sizes(n, w[1])
    proj = OpFlops(matmul=2 * b * s * din * w[1], other=b * s * w[1] if n.has_input(2) else 0)
    skv = s + (n.inp(4)[3] if n.has_input(4) else 0)  # past: [2, B, H, S_past, Dh]
    masked = n.has_input(3) or bool(n.attr("unidirectional", 0)) or n.has_input(5)
    return proj + _core(b, heads, s, skv, dq // heads, dv // heads, masked=masked)


def contrib_multihead_attention(n: NodeView) -> OpFlops:
    """com.microsoft MultiHeadAttention with separate 3-D query, key and value."""
    q = n.inp(0)
    if len(q) != 3 or not n.has_input(1) or not n.has_input(2):
        raise UnsupportedNode("only separate 3-D query, key and value are supported")
    k, v = n.inp(1), n.inp(2)
    if len(k) != 3 or len(v) != 3:
        raise UnsupportedNode("only 3-D key and value are supported")
    heads = int(n.attr("num_heads", 0))
    if heads <= 0:
        raise UnsupportedNode("attribute `num_heads` is missing")
    b, sq, dq = q
    skv = k[1] + (n.inp(6)[2] if n.has_input(6) else 0)  # past_key: [B, H, S_past, Dh]
    bias = numel(q) + numel(k) + numel(v) if n.has_input(3) else 0
    masked = n.has_input(4) or n.has_input(5)
    return OpFlops(other=bias) + _core(b, heads, sq, skv, dq // heads, v[2] // heads, masked=masked)
