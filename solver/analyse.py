"""The compiler's analysis stage: everything the solver adds to a bundle.

Called by `compiler/pipeline.py` after the index plan is built. Runs, in order: contract
feasibility (E501, cores mapped to spans), SLO-aware GPU-share bounds per contract and GPU
class (stored in the bundle for the placer), and request-rule analyses (E502 unsatisfiable,
W501 shadowed, W503 never rejects). Warnings are also kept in `Bundle.warnings` so that
runtime tools can show them without the source.
"""

from __future__ import annotations

from policyc.compiler.bundle import Bundle
from policyc.compiler.diagnostic import Diagnostic

from .contract_check import check_contract
from .rule_check import check_rules
from .shares import gpu_shares
from .verdict import new_solver


def analyse(bundle: Bundle) -> tuple[Bundle, list[Diagnostic]]:
    diags: list[Diagnostic] = []
    fast = new_solver()  # the linear feasibility query, reused for every contract
    for c in bundle.contracts:
        diags.extend(check_contract(c, bundle.gpu_catalog, fast))
    contracts = tuple(c.model_copy(update={"gpu_shares": gpu_shares(c, bundle.gpu_catalog)}) for c in bundle.contracts)
    bundle = bundle.model_copy(update={"contracts": contracts})
    diags.extend(check_rules(bundle))
    kept = tuple(d for d in diags if not d.is_error)
    return bundle.model_copy(update={"warnings": bundle.warnings + kept}), diags
