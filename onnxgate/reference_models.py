"""Reference transformer graphs built with `onnx.helper`, whose FLOPs are known analytically.

They exist to check the counter against arithmetic done by hand (tests), to time the gate
on models of a chosen size (benchmarks) and to show users a valid embedded model without a
download. Decoder-only GPT shape: token and position embeddings, `layers` blocks of
pre-norm causal multi-head attention and a GELU MLP, a final norm and an LM head. The
attention is written as explicit MatMul/Softmax nodes, as the ONNX `Attention` op, or as
onnxruntime's fused `com.microsoft.Attention`.

`weights="random"` stores real values (the model runs); `weights="absent"` records only
shapes and points the data at an external file that does not exist, which is how a graph
of billions of parameters is counted without the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 23
AttentionForm = Literal["explicit", "onnx", "contrib"]
Weights = Literal["random", "absent"]


@dataclass(frozen=True, slots=True)
class TransformerSpec:
    vocab: int = 1000
    d_model: int = 128
    heads: int = 4
    layers: int = 2
    d_ff: int = 512
    max_len: int = 512
    attention: AttentionForm = "explicit"

    def parameters(self) -> int:
        d, f = self.d_model, self.d_ff
        per_layer = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
        return self.vocab * d + self.max_len * d + self.layers * per_layer + 2 * d + d * self.vocab


class _Builder:
    def __init__(self, weights: Weights, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.weights = weights
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    def weight(self, name: str, shape: tuple[int, ...], scale: float = 0.02, fill: float | None = None) -> str:
        if self.weights == "absent":
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
            t.data_location = TensorProto.EXTERNAL
            t.external_data.add(key="location", value="weights.absent.bin")
        elif fill is not None:
            t = numpy_helper.from_array(np.full(shape, fill, dtype=np.float32), name)
        else:
            t = numpy_helper.from_array((self.rng.standard_normal(shape, dtype=np.float32) * scale), name)
        self.inits.append(t)
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))  # small shape constants stay inline
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs: Any) -> list[str]:
        base = self.name(op.lower())
        outs = [f"{base}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=base, domain=domain, **attrs))
        return outs

    def one(self, op: str, inputs: list[str], domain: str = "", **attrs: Any) -> str:
        return self.node(op, inputs, 1, domain, **attrs)[0]


def _layer_norm(b: _Builder, x: str, prefix: str, d: int) -> str:
    g = b.weight(f"{prefix}.gamma", (d,), fill=1.0)
    beta = b.weight(f"{prefix}.beta", (d,), fill=0.0)
    return b.one("LayerNormalization", [x, g, beta], axis=-1, epsilon=1e-5)


def _explicit_attention(b: _Builder, qkv: str, mask: str, spec: TransformerSpec) -> str:
    d, h = spec.d_model, spec.heads
    dh = d // h
    q, k, v = b.node("Split", [qkv, b.const(b.name("split"), np.array([d, d, d], np.int64))], 3, axis=-1)
    heads_shape = b.const(b.name("heads_shape"), np.array([0, 0, h, dh], np.int64))
    qh = b.one("Transpose", [b.one("Reshape", [q, heads_shape])], perm=[0, 2, 1, 3])
    kt = b.one("Transpose", [b.one("Reshape", [k, heads_shape])], perm=[0, 2, 3, 1])
    vh = b.one("Transpose", [b.one("Reshape", [v, heads_shape])], perm=[0, 2, 1, 3])
    scores = b.one("MatMul", [qh, kt])
    scaled = b.one("Mul", [scores, b.const(b.name("scale"), np.array(1.0 / np.sqrt(dh), np.float32))])
    probs = b.one("Softmax", [b.one("Add", [scaled, mask])], axis=-1)
    ctx = b.one("Transpose", [b.one("MatMul", [probs, vh])], perm=[0, 2, 1, 3])
    return b.one("Reshape", [ctx, b.const(b.name("merge_shape"), np.array([0, 0, d], np.int64))])


def _block(b: _Builder, x: str, mask: str, i: int, spec: TransformerSpec) -> str:
    d, f = spec.d_model, spec.d_ff
    p = f"layer{i}"
    h = _layer_norm(b, x, f"{p}.ln1", d)
    w_qkv, b_qkv = b.weight(f"{p}.attn.w_qkv", (d, 3 * d)), b.weight(f"{p}.attn.b_qkv", (3 * d,), fill=0.0)
    if spec.attention == "contrib":
        ctx = b.one("Attention", [h, w_qkv, b_qkv], domain="com.microsoft", num_heads=spec.heads, unidirectional=1)
    else:
        qkv = b.one("Add", [b.one("MatMul", [h, w_qkv]), b_qkv])
        if spec.attention == "onnx":
            q, k, v = b.node("Split", [qkv, b.const(b.name("split"), np.array([d, d, d], np.int64))], 3, axis=-1)
            ctx = b.one("Attention", [q, k, v], q_num_heads=spec.heads, kv_num_heads=spec.heads, is_causal=1)
        else:
            ctx = _explicit_attention(b, qkv, mask, spec)
    w_o, b_o = b.weight(f"{p}.attn.w_o", (d, d)), b.weight(f"{p}.attn.b_o", (d,), fill=0.0)
    x = b.one("Add", [x, b.one("Add", [b.one("MatMul", [ctx, w_o]), b_o])])
    h = _layer_norm(b, x, f"{p}.ln2", d)
    w1, b1 = b.weight(f"{p}.mlp.w1", (d, f)), b.weight(f"{p}.mlp.b1", (f,), fill=0.0)
    w2, b2 = b.weight(f"{p}.mlp.w2", (f, d)), b.weight(f"{p}.mlp.b2", (d,), fill=0.0)
    up = b.one("Gelu", [b.one("Add", [b.one("MatMul", [h, w1]), b1])])
    return b.one("Add", [x, b.one("Add", [b.one("MatMul", [up, w2]), b2])])


def build_transformer(spec: TransformerSpec, *, weights: Weights = "random", seed: int = 0) -> onnx.ModelProto:
    """A decoder-only transformer taking `input_ids[batch, sequence]` (int64) and returning
    `logits[batch, sequence, vocab]`."""
    if spec.d_model % spec.heads:
        raise ValueError(f"d_model {spec.d_model} is not divisible by heads {spec.heads}")
    b = _Builder(weights, seed)
    d = spec.d_model
    seq = b.one("Slice", [b.one("Shape", ["input_ids"]), b.const("one", np.array([1], np.int64)), b.const("two", np.array([2], np.int64))])
    tok = b.one("Gather", [b.weight("wte", (spec.vocab, d)), "input_ids"])
    pos = b.one("Slice", [b.weight("wpe", (spec.max_len, d)), b.const("zero", np.array([0], np.int64)), seq, b.const("axis0", np.array([0], np.int64))])
    x = b.one("Add", [tok, pos])
    mask = ""
    if spec.attention == "explicit":
        square = b.one("Concat", [seq, seq], axis=0)
        neg = b.one("ConstantOfShape", [square], value=numpy_helper.from_array(np.array([-1e4], np.float32)))
        mask = b.one("Trilu", [neg, b.const("k1", np.array(1, np.int64))], upper=1)
    for i in range(spec.layers):
        x = _block(b, x, mask, i, spec)
    h = _layer_norm(b, x, "ln_f", d)
    logits = b.one("MatMul", [h, b.weight("lm_head", (d, spec.vocab))])
    b.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits_out"))
    graph = helper.make_graph(
        b.nodes,
        f"gpt_{spec.layers}x{d}_{spec.attention}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", spec.vocab])],
        b.inits,
    )
    opsets = [helper.make_opsetid("", OPSET)]
    if spec.attention == "contrib":
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10, producer_name="policyc.reference_models")
