"""The counter against FLOPs worked out by hand for real transformer graphs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from policyc.onnxgate import Convention, count_flops
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer

FORMS = ("explicit", "onnx", "contrib")


def analytic_matmul(s: TransformerSpec, t: int) -> int:
    """Matrix-multiply FLOPs of one request of t tokens (2 per multiply-accumulate)."""
    d, f = s.d_model, s.d_ff
    per_layer = 2 * t * d * 3 * d + 2 * t * t * d + 2 * t * t * d + 2 * t * d * d + 2 * t * d * f + 2 * t * f * d
    return s.layers * per_layer + 2 * t * d * s.vocab


def analytic_all(s: TransformerSpec, t: int) -> int:
    """Every op under the documented convention (rules_pointwise / rules_attention)."""
    d, f, h = s.d_model, s.d_ff, s.heads
    layer_norm = 7 * t * d  # 6 per element + beta
    scores = h * t * t
    per_layer = (
        2 * layer_norm
        + 3 * t * d  # qkv bias
        + scores * (1 + 1 + 5)  # scale, causal mask, softmax
        + t * d + t * d  # out-proj bias, residual
        + t * f + 5 * t * f  # mlp bias, exact gelu
        + t * d + t * d  # down-proj bias, residual
    )
    return analytic_matmul(s, t) + s.layers * per_layer + t * d + layer_norm  # + embedding add, final norm


SPECS = [
    TransformerSpec(vocab=1000, d_model=128, heads=4, layers=2, d_ff=512),
    TransformerSpec(vocab=3000, d_model=96, heads=3, layers=3, d_ff=384, max_len=300),
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS, ids=["2x128", "3x96"])
@pytest.mark.parametrize("tokens", [1, 64, 200])
def test_matmul_convention_is_exact(spec: TransformerSpec, form: str, tokens: int) -> None:
    spec = replace(spec, attention=form)
    count = count_flops(build_transformer(spec, weights="absent"), tokens)
    assert count.total(Convention.MATMUL) == analytic_matmul(spec, tokens)
    assert count.total(Convention.ALL) == analytic_all(spec, tokens)


def test_all_ops_within_two_percent_of_the_matmul_analytic_figure() -> None:
    """GPT-2-small shape: element-wise work is small beside the matrix products."""
    spec = TransformerSpec(vocab=50257, d_model=768, heads=12, layers=12, d_ff=3072, max_len=1024)
    count = count_flops(build_transformer(spec, weights="absent"), 128)
    analytic = analytic_matmul(spec, 128)
    assert count.total(Convention.MATMUL) == analytic
    assert abs(count.total() - analytic) / analytic < 0.02
    assert count.total() > analytic  # the rest is counted, not dropped


@pytest.mark.parametrize("form", FORMS)
def test_reference_models_are_valid_and_run(form: str) -> None:
    model = build_transformer(TransformerSpec(vocab=200, d_model=32, heads=2, layers=2, d_ff=64, attention=form))
    if form != "contrib":  # onnx.checker does not know com.microsoft schemas
        onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = sess.run(None, {"input_ids": np.arange(10, dtype=np.int64)[None, :]})
    assert logits.shape == (1, 10, 200) and np.isfinite(logits).all()


def test_parameter_count_matches_initializers() -> None:
    spec = TransformerSpec(vocab=300, d_model=48, heads=4, layers=3, d_ff=96)
    model = build_transformer(spec, weights="absent")
    weights = [i for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    assert sum(int(np.prod(i.dims)) for i in weights) == spec.parameters()


def test_six_billion_parameter_graph_is_counted_without_weights() -> None:
    """GPT-J shape: 28 layers of 4096; weight data points at a file that does not exist."""
    spec = TransformerSpec(vocab=50400, d_model=4096, heads=16, layers=28, d_ff=16384, max_len=2048)
    model = build_transformer(spec, weights="absent")
    assert spec.parameters() > 6e9
    assert model.ByteSize() < 1_000_000
    assert count_flops(model, 128).total(Convention.MATMUL) == analytic_matmul(spec, 128)
