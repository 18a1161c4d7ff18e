"""The breaker actions: one table every layer reads (the closed vocabulary of what a
circuit-break rule may do, declared once, as Cedar declares its lints).

Each row names the bundle's model of the action (whose `kind`, the discriminator of the
bundle's `Action` union, is the action's word in the DSL, the bundle and the audit log),
whether the DSL configures it with a block (`redirect { … }`), the rule scopes it can act
in, and what it does. The compiler lowers and checks `actions = [...]` from it
(`breakers.py`), the rule table checks scopes against it (`enforcer/rule_table.py`), and
the guardian and the gateway dispatch on its words (`enforcer/guardian.py`,
`gateway/acts.py`); `tests/compiler/test_vocabularies.py` holds every layer to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .bundle import CancelStream, Quarantine, Redirect, ReportAnomaly, SelfHeal

SCOPES = ("request", "gpu", "backend", "connection")  # what a breaker counts in (`Breaker.scope`)


@dataclass(frozen=True, slots=True)
class ActionSpec:
    model: type  # the bundle's model (`bundle.Action`'s member)
    configured: bool  # written with its own block in the DSL: `NAME { … }`
    scopes: tuple[str, ...]  # the rule scopes it can act in
    does: str  # one line, for documentation and diagnostics

    @property
    def kind(self) -> str:
        """The action's word: the model's `kind` discriminator."""
        return str(self.model.model_fields["kind"].default)  # type: ignore[attr-defined]


TABLE: tuple[ActionSpec, ...] = (
    ActionSpec(CancelStream, False, ("request",), "cancel the request's stream at the moment its budget is crossed"),
    ActionSpec(Redirect, True, SCOPES, "retry the request on a backup model, within the rule's retry budget"),
    ActionSpec(Quarantine, True, SCOPES, "steer new connections away from the backend for a doubling while, in the kernel"),
    ActionSpec(ReportAnomaly, False, SCOPES, "lower the GPU's health in the placer (visible on its next tick)"),
    ActionSpec(SelfHeal, True, ("gpu",), "run recovery steps on the GPU through the executor (dry run by default)"),
)

BY_KIND: dict[str, ActionSpec] = {a.kind: a for a in TABLE}
KINDS: tuple[str, ...] = tuple(BY_KIND)
CONFIGURED: tuple[str, ...] = tuple(a.kind for a in TABLE if a.configured)
BY_MODEL: dict[type, ActionSpec] = {a.model: a for a in TABLE}
# the words, for dispatch
CANCEL_STREAM = BY_MODEL[CancelStream].kind
REDIRECT = BY_MODEL[Redirect].kind
QUARANTINE = BY_MODEL[Quarantine].kind
REPORT_ANOMALY = BY_MODEL[ReportAnomaly].kind
SELF_HEAL = BY_MODEL[SelfHeal].kind


def kind(action: Any) -> str:
    """An action's word (`action.kind`)."""
    return str(action.kind)


def scope_problem(action: Any, scope: str) -> str | None:
    """Why `action` cannot act in a rule of `scope`, or None when it can."""
    spec = BY_KIND.get(kind(action))
    if spec is None:
        return f"`{kind(action)}` is not a breaker action (known: {', '.join(KINDS)})"
    if scope not in spec.scopes:
        where = " or ".join(f"`{s}`" for s in spec.scopes)
        return f"{spec.kind} acts in a rule of scope {where}, but the rule's scope is `{scope}`"
    return None


__all__ = ["BY_KIND", "BY_MODEL", "CANCEL_STREAM", "CONFIGURED", "KINDS", "QUARANTINE", "REDIRECT", "REPORT_ANOMALY", "SCOPES",
           "SELF_HEAL", "TABLE", "ActionSpec", "kind", "scope_problem"]
