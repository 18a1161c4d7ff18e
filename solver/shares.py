"""SLO-aware GPU-share lower bounds: how much of each GPU class a request must reserve.

Instead of "give it 2 GPUs and see", the contract's FLOPs upper bound and latency window
fix the compute rate a request needs, and its bandwidth need fixes a share of HBM. The
formula and its semantics (the bandwidth term, a contract without an SLO) are
`policyc.compiler.meaning.gpu_share`'s; this stage records its answer per GPU class of the
catalog in the bundle, which the placer and the audit read.
"""

from __future__ import annotations

from policyc.compiler.bundle import Contract, GpuClass, GpuShare
from policyc.compiler.meaning import contract_share


def gpu_share(contract: Contract, gpu: GpuClass) -> GpuShare:
    s = contract_share(contract, gpu)
    return GpuShare(gpu=s.gpu, feasible=s.feasible, min_share=s.min_share, binding=s.binding.value, detail=s.detail)


def gpu_shares(contract: Contract, catalog: tuple[GpuClass, ...]) -> tuple[GpuShare, ...]:
    return tuple(gpu_share(contract, g) for g in catalog)
