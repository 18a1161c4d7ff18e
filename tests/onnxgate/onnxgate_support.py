"""Shared builders for the ONNX gate tests: contracts made directly as `Contract` objects
and reference transformer models built in the test run (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from policyc.compiler.bundle import Compute, Contract, Dependencies, Interval, Memory, ServiceDependency, SourceRef
from policyc.onnxgate import embed_contract
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer

HERE = SourceRef(file="tests/onnxgate/x.contract", line=1, col=1)


def make_contract(lo: float, hi: float, *, tokens: int = 128, per: str = "request", name: str = "fraud-scorer") -> Contract:
    return Contract(
        name=name,
        version="2.3.0",
        compute=Compute(flops=Interval(lo=lo, hi=hi), per=per, tokens=tokens),
        memory=Memory(bandwidth_min=80e9, burst_max=0.2),
        dependencies=Dependencies(services=(ServiceDependency(name="cache", kind="redis", p99=0.005, origin=HERE),)),
        origin=HERE,
    )


@pytest.fixture
def contract_factory() -> Callable[..., Contract]:
    return make_contract


@pytest.fixture(scope="session")
def small_model() -> onnx.ModelProto:
    return build_transformer(TransformerSpec(vocab=500, d_model=64, heads=4, layers=2, d_ff=256, max_len=256))


@pytest.fixture
def write_model(tmp_path: Path) -> Callable[[onnx.ModelProto, str], Path]:
    def write(model: onnx.ModelProto, name: str = "model.onnx") -> Path:
        path = tmp_path / name
        path.write_bytes(model.SerializeToString())
        return path

    return write


@pytest.fixture
def embedded(small_model: onnx.ModelProto, write_model, contract_factory) -> Callable[[float, float], Path]:
    def make(lo: float, hi: float, tokens: int = 32) -> Path:
        return write_model(embed_contract(small_model, contract_factory(lo, hi, tokens=tokens)), "embedded.onnx")

    return make
