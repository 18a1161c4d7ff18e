"""The GPU share a request needs on each GPU class: the solver's bound when the bundle has
one, otherwise the same formula computed here from the catalog.

share = flops_hi / (peak(precision) * efficiency * (latency - allowance)): the fraction of
a GPU that finishes the contract's worst-case request inside its latency target, leaving
the allowance for network and queueing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from policyc.compiler.bundle import Contract, GpuClass

from .plan import ShareSource


@dataclass(frozen=True, slots=True)
class ShareBound:
    gpu_class: str
    feasible: bool
    min_share: float  # meaningful only when feasible
    source: ShareSource
    detail: str


def share_bounds(contract: Contract, classes: Iterable[str], catalog: dict[str, GpuClass], budget: float) -> dict[str, ShareBound]:
    solver = {s.gpu: s for s in contract.gpu_shares}
    out: dict[str, ShareBound] = {}
    for name in set(classes):
        s = solver.get(name)
        if s is not None:
            if not s.feasible or s.min_share is None:
                out[name] = ShareBound(name, False, 1.0, ShareSource.SOLVER, f"solver: infeasible on `{name}` ({s.binding}: {s.detail})")
            else:
                out[name] = ShareBound(name, True, float(s.min_share), ShareSource.SOLVER, f"solver: min share {s.min_share:.3f} ({s.binding})")
            continue
        out[name] = _from_catalog(contract, name, catalog.get(name), budget)
    return out


def _from_catalog(contract: Contract, name: str, gpu: GpuClass | None, budget: float) -> ShareBound:
    if gpu is None:
        return ShareBound(name, False, 1.0, ShareSource.CATALOG, f"GPU class `{name}` is not in the catalog")
    if contract.gpu_arch and gpu.arch not in contract.gpu_arch:
        return ShareBound(name, False, 1.0, ShareSource.CATALOG, f"architecture `{gpu.arch}` not allowed by the contract")
    c = contract.compute
    peak = gpu.peak(c.precision)
    if peak is None:
        return ShareBound(name, False, 1.0, ShareSource.CATALOG, f"`{name}` has no {c.precision} peak in the catalog")
    latency = contract.slo.latency if contract.slo is not None else budget
    allowance = contract.slo.allowance if contract.slo is not None else 0.0
    window = latency - allowance
    if window <= 0:
        return ShareBound(name, False, 1.0, ShareSource.CATALOG, f"SLO {latency * 1e3:g} ms leaves no time after the {allowance * 1e3:g} ms allowance")
    share = c.request_flops().hi / (peak * c.efficiency * window)
    if share > 1.0:
        return ShareBound(name, False, share, ShareSource.CATALOG,
                          f"needs {share:.2f} of a `{name}` to finish {c.request_flops().hi:.3g} FLOPs in {window * 1e3:g} ms")
    return ShareBound(name, True, share, ShareSource.CATALOG,
                      f"no solver bound for `{name}`: computed from the catalog, share = flops_hi / (peak * efficiency * (latency - allowance)) = {share:.3f}")
