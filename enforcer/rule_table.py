"""Bundle breakers lowered to the tables the guardian and the kernel plane run on.

The compiler's `Breaker` rows are data; here they are grouped by scope, given stable small
integer ids (the kernel knows rules by number) and, for request-scoped budget rules, turned
into absolute budgets per contract. The kernel cannot read `:path`, so it flags streams
against the tightest budget (`stream_budget_ns`); per-request decisions stay in user space.
A budget relative to the request's own predicted latency (`elapsed >= 300 % of predicted`)
is known only once the request is placed, so it is never a kernel budget: the guardian
arms it per request.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass

from policyc.compiler.actions import scope_problem
from policyc.compiler.bundle import (
    Breaker,
    Bundle,
    Quarantine,
    SignalCondition,
)

# a condition's comparison; works on scalars and, elementwise, on numpy arrays
COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
ELAPSED = "elapsed"  # seconds a request has used; with `of`, a share of its SLO or of its predicted latency


class RuleTableError(ValueError):
    """A breaker the enforcer cannot carry out; the message names the rule and its origin."""


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """A request-scoped breaker whose trigger is elapsed time: fires `budget` seconds after
    the request starts or, for a rule on the request's prediction, at `of_predicted` times
    the end-to-end latency its placement predicted (the later of the two when it has both)."""

    rule_id: int
    breaker: Breaker
    model: str
    budget: float | None  # seconds after the request starts; None: only relative to the prediction
    slo: float | None
    of_predicted: float | None = None  # `elapsed >= 300 % of predicted` -> 3.0

    def seconds(self, predicted: float | None) -> float | None:
        """When the rule fires for a request placed with `predicted` seconds end to end
        (None: unknown, so a rule on the prediction does not apply)."""
        if self.of_predicted is None:
            return self.budget
        if predicted is None or not predicted > 0:
            return None
        relative = self.of_predicted * predicted
        return relative if self.budget is None else max(self.budget, relative)


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

    def budget_for(self, model: str, predicted: float | None = None) -> tuple[BudgetRule, float] | None:
        """The budget rule that fires first for a request to `model` whose placement
        predicted `predicted` seconds, and after how many seconds it fires."""
        found = [(b, s) for b in self.budgets if b.model == model and (s := b.seconds(predicted)) is not None]
        return min(found, key=lambda x: x[1]) if found else None

    def kernel_rules(self) -> KernelRules:
        budgets: dict[int, int] = {}
        for b in self.budgets:
            if b.of_predicted is not None or b.budget is None:
                continue  # known per request only: armed by the guardian
            ns = int(b.budget * 1e9)
            budgets[b.rule_id] = min(ns, budgets.get(b.rule_id, ns))
        names = {i: n for n, i in self.ids.items()}
        return KernelRules(budgets, names, min(budgets.values(), default=0))


def holds(cond: SignalCondition, value: float, slo: float | None = None) -> bool:
    """Does `signal cmp value` hold? With `of: slo`, the threshold is a fraction of the SLO;
    without an SLO, or for a share of a request's prediction (known only to the budget
    rules the guardian arms per request), the condition does not hold."""
    threshold = cond.value
    if cond.of is not None:
        if cond.of != "slo" or slo is None:
            return False
        threshold = cond.value * slo
    return bool(COMPARE[cond.cmp](value, threshold))


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
        if (problem := scope_problem(a, breaker.scope)) is not None:  # the action table's scopes
            raise RuleTableError(f"{where}: {problem}")


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
                for cond in elapsed:
                    if cond.cmp not in (">", ">="):
                        raise RuleTableError(f"{cond.origin}: a budget on `elapsed` must use > or >=")
                if slo is None and any(c.of == "slo" for c in elapsed):
                    continue  # the contract declares no SLO: no budget to track
                fixed = [c.value * (slo if c.of == "slo" else 1.0) for c in elapsed if c.of != "predicted"]  # type: ignore[operator]
                relative = [c.value for c in elapsed if c.of == "predicted"]
                budgets.append(BudgetRule(ids[breaker.name], breaker, model, max(fixed, default=None), slo,
                                          max(relative, default=None)))
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
