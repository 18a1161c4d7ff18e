"""Re-validate a loaded bundle with the compiler's own checks.

A bundle's hash proves only that nobody changed it *without re-hashing*; anyone can
recompute a sha256. So every loader (`bundle_io.loads`: `inspect`, `serve`, `diff`,
`ReloadBundle`, SIGHUP) runs, after the schema and before anything serves from it, the
same function the compiler ends its `resolve` stage with — unique names, references that
land, value ranges (`check_values`), rule shape and types (`check_rules`) — and recomputes
what the compiler derives from the rules — the index plan, the latency targets — (a plan
that disagrees with its rules would index one meaning and evaluate another). A bundle the compiler would refuse never serves.

The solver's verdicts (feasibility, GPU-share bounds) are not recomputed here: that is
seconds of Z3 per thousand contracts; their stored shares are range-checked instead.
"""

from __future__ import annotations

from policyc.compiler.diagnostic import Diagnostic, error

from .bundle import Bundle, Var
from .index import plan_index
from .meaning import latency_targets
from .resolve import resolve
from .semantics import atoms


def check_bundle(bundle: Bundle) -> list[Diagnostic]:
    """Every error the compiler's checks find in this bundle (empty: it may serve)."""
    diags: list[Diagnostic] = []
    resolve(list(bundle.contracts), list(bundle.gpu_catalog), list(bundle.headers), list(bundle.tenants),
            list(bundle.rules), list(bundle.breakers), diags)
    errors = [d for d in diags if d.is_error]
    if not errors and plan_index(list(bundle.rules), list(bundle.headers)) != bundle.index_plan:
        errors.append(error("E603", "the bundle's index plan is not the one its rules give", None,
                            "recompile the bundle; an index plan is never edited by hand"))
    targets = latency_targets((a.attr, a.cmp, a.operand.name if isinstance(a.operand, Var) else None)
                              for r in bundle.rules for a in atoms(r.require))
    if not errors and targets != bundle.latency_targets:
        errors.append(error("E604", "the bundle's latency targets are not the ones its rules give", None,
                            "recompile the bundle; its derived meaning is never edited by hand"))
    return errors
