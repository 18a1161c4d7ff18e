"""Resource estimates follow from the contract and placement, and every figure says
whether it was measured or estimated."""

from __future__ import annotations

import pytest

from policyc.audit.accounting import estimate_resources, measured
from policyc.audit.records import Source
from policyc.compiler.bundle import Compute, Contract, Dependencies, GpuClass, Interval, Memory, SourceRef

HERE = SourceRef(file="policies/recommender.contract", line=1, col=1)
CONTRACT = Contract(
    name="recommender",
    version="2.1",
    compute=Compute(flops=Interval(lo=1.2e12, hi=1.8e12), per="request", tokens=128, precision="fp16", efficiency=0.5),
    memory=Memory(bandwidth_min=80e9, burst_max=0.2),
    dependencies=Dependencies(),
    origin=HERE,
)
A100 = GpuClass(name="A100-80G", arch="ampere", peak_flops=(("fp16", 312e12), ("fp32", 19.5e12)), hbm_bandwidth=2.0e12, memory=80e9, origin=HERE)


def test_estimate_from_contract_and_share() -> None:
    r = estimate_resources(CONTRACT, A100, 0.25)
    g = r.gpu_seconds
    assert g is not None and g.source is Source.ESTIMATED
    assert g.low == pytest.approx(1.2e12 / 156e12) and g.high == pytest.approx(1.8e12 / 156e12)
    assert g.value == pytest.approx(1.5e12 / 156e12)
    m = r.memory_bytes
    assert m is not None and m.source is Source.ESTIMATED
    assert m.value == pytest.approx(80e9 * (1.5e12 / 156e12) / 0.25)  # sustained bandwidth x duration on the share
    assert r.network_bytes is None  # never invented


def test_tokens_scale_the_estimate() -> None:
    base = estimate_resources(CONTRACT, A100, 1.0).gpu_seconds
    double = estimate_resources(CONTRACT, A100, 1.0, tokens=256).gpu_seconds
    assert base is not None and double is not None and double.value == pytest.approx(2 * base.value)


def test_measured_figures_replace_estimates_and_are_labelled() -> None:
    r = estimate_resources(CONTRACT, A100, 0.5, gpu_seconds=measured(0.011, "nvml"), network_bytes=measured(5120, "kernel_flow_counters"))
    assert r.gpu_seconds is not None and r.gpu_seconds.source is Source.MEASURED and r.gpu_seconds.method == "nvml"
    assert r.network_bytes is not None and r.network_bytes.source is Source.MEASURED
    assert r.memory_bytes is not None and r.memory_bytes.source is Source.ESTIMATED


def test_unknown_precision_leaves_the_figure_absent() -> None:
    fp8 = CONTRACT.model_copy(update={"compute": CONTRACT.compute.model_copy(update={"precision": "fp8"})})
    r = estimate_resources(fp8, A100, 0.5)
    assert r.gpu_seconds is None and r.memory_bytes is None


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_bad_share_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="GPU share"):
        estimate_resources(CONTRACT, A100, share)
