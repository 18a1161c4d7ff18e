"""The GPU share a request needs on each GPU class: the bundle's, which the compiler
stored per class of its catalog, or, for a class the bundle's catalog lacks but the
placer's has, the same `policyc.compiler.meaning.contract_share` worked out here.

Either way the semantics are the compiler's (the contract's own latency window, the
bandwidth term, bandwidth alone without an SLO): the placer never has a formula of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policyc.compiler.bundle import Contract, GpuClass
from policyc.compiler.meaning import contract_share

from .plan import ShareSource


@dataclass(frozen=True, slots=True)
class ShareBound:
    gpu_class: str
    feasible: bool
    min_share: float  # meaningful only when feasible
    source: ShareSource
    detail: str


def share_bounds(contract: Contract, classes: Iterable[str], catalog: Mapping[str, GpuClass]) -> dict[str, ShareBound]:
    stored = {s.gpu: s for s in contract.gpu_shares}
    out: dict[str, ShareBound] = {}
    for name in set(classes):
        s = stored.get(name)
        if s is not None:
            if not s.feasible or s.min_share is None:
                out[name] = ShareBound(name, False, 1.0, ShareSource.SOLVER, f"solver: infeasible on `{name}` ({s.binding}: {s.detail})")
            else:
                out[name] = ShareBound(name, True, float(s.min_share), ShareSource.SOLVER, f"solver: min share {s.min_share:.3f} ({s.binding})")
            continue
        gpu = catalog.get(name)
        if gpu is None:
            out[name] = ShareBound(name, False, 1.0, ShareSource.CATALOG, f"GPU class `{name}` is not in the catalog")
            continue
        m = contract_share(contract, gpu)
        if not m.feasible or m.min_share is None:
            out[name] = ShareBound(name, False, 1.0, ShareSource.CATALOG, f"infeasible on `{name}` ({m.binding}: {m.detail})")
        else:
            out[name] = ShareBound(name, True, m.min_share, ShareSource.CATALOG,
                                   f"no stored bound for `{name}`: computed from the catalog, {m.min_share:.3f} ({m.binding}: {m.detail})")
    return out
