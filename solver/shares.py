"""SLO-aware GPU-share lower bounds: how much of each GPU class a request must reserve.

Instead of "give it 2 GPUs and see", the contract's FLOPs upper bound and latency target
fix the compute rate a request needs; its bandwidth need fixes a share of HBM. With
t = SLO latency − network/queueing allowance:

    compute share   = flops_hi / (peak(precision) · efficiency · t)
    bandwidth share = bandwidth_min / hbm_bandwidth
    min share       = max(compute share, bandwidth share), feasible when ≤ 1

The binding constraint is the larger term, or the first hard mismatch (architecture not
allowed, precision not offered, bandwidth above the GPU's HBM).
"""

from __future__ import annotations

from policyc.compiler.bundle import Contract, GpuClass, GpuShare


def gpu_share(contract: Contract, gpu: GpuClass) -> GpuShare:
    if contract.gpu_arch and gpu.arch not in contract.gpu_arch:
        return GpuShare(gpu=gpu.name, feasible=False, binding="architecture",
                        detail=f"{gpu.arch} is not among the contract's architectures ({', '.join(contract.gpu_arch)})")
    peak = gpu.peak(contract.compute.precision)
    if peak is None:
        return GpuShare(gpu=gpu.name, feasible=False, binding="precision",
                        detail=f"{gpu.name} has no {contract.compute.precision} peak in the catalog")
    bw_share = contract.memory.bandwidth_min / gpu.hbm_bandwidth
    if bw_share > 1:
        return GpuShare(gpu=gpu.name, feasible=False, binding="bandwidth",
                        detail=f"needs {contract.memory.bandwidth_min / 1e9:g} GB/s, {gpu.name} offers {gpu.hbm_bandwidth / 1e9:g} GB/s")
    flops_hi = contract.compute.request_flops().hi
    if contract.slo is None:
        return GpuShare(gpu=gpu.name, feasible=True, min_share=bw_share, binding="bandwidth",
                        detail="no SLO: only the bandwidth need bounds the share")
    budget = contract.slo.latency - contract.slo.allowance
    if budget <= 0:
        return GpuShare(gpu=gpu.name, feasible=False, binding="slo",
                        detail="the network/queueing allowance consumes the whole SLO")
    rate = peak * contract.compute.efficiency
    compute_share = flops_hi / (rate * budget)
    if compute_share > 1:
        fastest = flops_hi / rate
        return GpuShare(gpu=gpu.name, feasible=False, binding="compute",
                        detail=f"{flops_hi:.3g} FLOPs take {fastest * 1e3:.1f} ms on a whole {gpu.name}, "
                               f"over the {budget * 1e3:g} ms compute budget")
    if compute_share >= bw_share:
        return GpuShare(gpu=gpu.name, feasible=True, min_share=compute_share, binding="compute",
                        detail=f"{flops_hi:.3g} FLOPs in {budget * 1e3:g} ms at {contract.compute.efficiency:.0%} of {peak / 1e12:g} TFLOP/s")
    return GpuShare(gpu=gpu.name, feasible=True, min_share=bw_share, binding="bandwidth",
                    detail=f"{contract.memory.bandwidth_min / 1e9:g} of {gpu.hbm_bandwidth / 1e9:g} GB/s")


def gpu_shares(contract: Contract, catalog: tuple[GpuClass, ...]) -> tuple[GpuShare, ...]:
    return tuple(gpu_share(contract, g) for g in catalog)
