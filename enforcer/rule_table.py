"""Bundle breakers lowered to the tables the guardian and the kernel plane run on.

The compiler's `Breaker` rows are data; here they are grouped by scope, given stable small
integer ids (the kernel knows rules by number) and, for request-scoped budget rules, turned
into absolute budgets per contract. The kernel cannot read `:path`, so it flags streams
against the tightest budget (`stream_budget_ns`); per-request decisions stay in user space.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policyc.compiler.bundle import (
    Breaker,
    Bundle,
    CancelStream,
    Quarantine,
    Redirect,
    ReportAnomaly,
    SelfHeal,
    SignalCondition,
)

ELAPSED = "elapsed"  # seconds a request has used; with `of: slo`, a fraction of its SLO


class RuleTableError(ValueError):
    """A breaker the enforcer cannot carry out; the message names the rule and its origin."""


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """A request-scoped breaker whose trigger is elapsed time: fires at `budget` seconds."""

    rule_id: int
    breaker: Breaker
    model: str
    budget: float  # seconds after the request starts
    slo: float | None


@dataclass(frozen=True, slots=True)
class KernelRules:
    budgets_ns: Mapping[int, int]  # rule id -> budget (ns)
    names: Mapping[int, str]  # rule id -> breaker name
    stream_budget_ns: int  # 0: no budget


@dataclass(frozen=True, slots=True)
class RuleTable:
    ids: Mapping[str, int]  # breaker name -> id
    budgets: tuple[BudgetRule, ...]
    request_rules: tuple[Breaker, ...]  # request scope, triggered by signals other than elapsed alone
    gpu_rules: tuple[Breaker, ...]
    backend_rules: tuple[Breaker, ...]
    connection_rules: tuple[Breaker, ...]

    def budget_for(self, model: str) -> BudgetRule | None:
        """The earliest budget rule that applies to `model`."""
        found = [b for b in self.budgets if b.model == model]
        return min(found, key=lambda b: b.budget) if found else None

    def kernel_rules(self) -> KernelRules:
        budgets: dict[int, int] = {}
        for b in self.budgets:
            ns = int(b.budget * 1e9)
            budgets[b.rule_id] = min(ns, budgets.get(b.rule_id, ns))
        names = {i: n for n, i in self.ids.items()}
        return KernelRules(budgets, names, min(budgets.values(), default=0))


def holds(cond: SignalCondition, value: float, slo: float | None = None) -> bool:
    """Does `signal cmp value` hold? With `of: slo`, the threshold is a fraction of the SLO."""
    threshold = cond.value
    if cond.of == "slo":
        if slo is None:
            return False
        threshold = cond.value * slo
    return {"<": value < threshold, "<=": value <= threshold, ">": value > threshold, ">=": value >= threshold}[cond.cmp]


def all_hold(breaker: Breaker, signals: Mapping[str, float], slo: float | None = None) -> bool:
    """Every condition holds on the signals present; a missing signal means the rule does not fire."""
    return all(c.signal in signals and holds(c, signals[c.signal], slo) for c in breaker.conditions)


def _check(breaker: Breaker) -> None:
    where = f"{breaker.origin}: breaker `{breaker.name}`"
    if not breaker.conditions:
        raise RuleTableError(f"{where} has no conditions")
    if breaker.consecutive < 1:
        raise RuleTableError(f"{where}: `consecutive` must be at least 1, got {breaker.consecutive}")
    if not 0.0 <= breaker.retry_budget <= 1.0:
        raise RuleTableError(f"{where}: retry budget {breaker.retry_budget} is not a share in [0, 1]")
    for a in breaker.actions:
        if isinstance(a, Quarantine) and (a.duration <= 0 or a.max_duration < a.duration or not 0 < a.max_share <= 1):
            raise RuleTableError(f"{where}: quarantine needs 0 < duration <= max_duration and max_share in (0, 1]")
        if isinstance(a, CancelStream) and breaker.scope != "request":
            raise RuleTableError(f"{where}: cancel_stream acts on one request, but the rule's scope is `{breaker.scope}`")
        if isinstance(a, SelfHeal) and breaker.scope != "gpu":
            raise RuleTableError(f"{where}: self_heal acts on a GPU, but the rule's scope is `{breaker.scope}`")
        if isinstance(a, (Redirect, ReportAnomaly)):
            continue


def build_rule_table(bundle: Bundle) -> RuleTable:
    """Lower `bundle.breakers`; raises RuleTableError naming the first unusable rule."""
    ids: dict[str, int] = {}
    budgets: list[BudgetRule] = []
    by_scope: dict[str, list[Breaker]] = {"request": [], "gpu": [], "backend": [], "connection": []}
    for breaker in bundle.breakers:
        _check(breaker)
        if breaker.name in ids:
            raise RuleTableError(f"{breaker.origin}: breaker `{breaker.name}` is defined twice")
        ids[breaker.name] = len(ids) + 1
        elapsed = [c for c in breaker.conditions if c.signal == ELAPSED]
        if breaker.scope == "request" and elapsed and len(elapsed) == len(breaker.conditions):
            models = breaker.models or tuple(c.name for c in bundle.contracts)
            for model in models:
                contract = bundle.contract(model)
                slo = contract.slo.latency if contract and contract.slo else None
                cond = elapsed[0]
                if cond.cmp not in (">", ">="):
                    raise RuleTableError(f"{cond.origin}: a budget on `elapsed` must use > or >=")
                if cond.of == "slo" and slo is None:
                    continue  # the contract declares no SLO: no budget to track
                budget = max(c.value * (slo if c.of == "slo" else 1.0) for c in elapsed)  # type: ignore[operator]
                budgets.append(BudgetRule(ids[breaker.name], breaker, model, budget, slo))
        else:
            by_scope[breaker.scope].append(breaker)
    return RuleTable(
        ids=ids,
        budgets=tuple(budgets),
        request_rules=tuple(by_scope["request"]),
        gpu_rules=tuple(by_scope["gpu"]),
        backend_rules=tuple(by_scope["backend"]),
        connection_rules=tuple(by_scope["connection"]),
    )
