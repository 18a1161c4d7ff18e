"""The compiler's analysis stage: everything the solver adds to a bundle.

Called by `compiler/pipeline.py` after the index plan is built; returns the bundle with
per-contract GPU-share bounds filled in, and the diagnostics the analyses produced.
"""

from __future__ import annotations

from policyc.compiler.bundle import Bundle
from policyc.dsl.diagnostics import Diagnostic

from .shares import gpu_shares


def analyse(bundle: Bundle) -> tuple[Bundle, list[Diagnostic]]:
    diags: list[Diagnostic] = []
    contracts = tuple(c.model_copy(update={"gpu_shares": gpu_shares(c, bundle.gpu_catalog)}) for c in bundle.contracts)
    return bundle.model_copy(update={"contracts": contracts}), diags
