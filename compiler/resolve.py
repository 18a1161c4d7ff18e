"""Names and references across all files compiled together.

Names are unique per kind across files (contracts, GPU classes, rules, breakers, header
mappings, request variables, tenants). Every reference must land: a breaker's models and
backup, a rule's `model == …`, `gpu_model == …`. Runs after lowering, on bundle entities,
and ends with the value and rule checks (`check_values`, `check_rules`) that every bundle
loader runs too (`revalidate.py`): one function decides what a valid bundle is.
"""

from __future__ import annotations

from typing import Iterable

from policyc.compiler.diagnostic import Diagnostic, Note, did_you_mean, error

from .bundle import Breaker, Contract, GpuClass, HeaderMapping, Redirect, RequestRule, SourceRef, Tenant
from .check_rules import check_rules
from .check_values import ARCHS, check_values, span
from .semantics import atoms

__all__ = ["resolve", "span"]


def _unique(kind: str, items: Iterable[tuple[str, SourceRef]], diags: list[Diagnostic]) -> None:
    first: dict[str, SourceRef] = {}
    for name, origin in items:
        if name in first:
            diags.append(error("E413", f"{kind} `{name}` is declared twice", span(origin),
                               notes=[Note(span(first[name]), "first declared here")]))
        else:
            first[name] = origin


def resolve(contracts: list[Contract], gpus: list[GpuClass], headers: list[HeaderMapping], tenants: list[Tenant],
            rules: list[RequestRule], breakers: list[Breaker], diags: list[Diagnostic]) -> None:
    _unique("contract", ((c.name, c.origin) for c in contracts), diags)
    _unique("gpu class", ((g.name, g.origin) for g in gpus), diags)
    _unique("header mapping", ((h.header.lower(), h.origin) for h in headers), diags)
    _unique("request variable", ((h.var, h.origin) for h in headers), diags)
    _unique("tenant", ((t.name, t.origin) for t in tenants), diags)
    _unique("rule", ((r.id, r.origin) for r in rules), diags)
    _unique("breaker", ((b.name, b.origin) for b in breakers), diags)

    models = {c.name for c in contracts}
    gpu_names = {g.name for g in gpus}
    known = {"model": models, "gpu_model": gpu_names, "gpu_arch": set(ARCHS)}
    for rule in rules:
        for a in atoms(rule.require):
            domain = known.get(a.attr)
            if domain is None or a.operand.kind != "const":
                continue
            values = a.operand.value if isinstance(a.operand.value, tuple) else (a.operand.value,)
            for v in values:
                if v not in domain:
                    what = {"model": "model (no contract of that name)", "gpu_model": "GPU class", "gpu_arch": "GPU architecture"}[a.attr]
                    diags.append(error("E414", f"unknown {what} `{v}` in rule `{rule.id}`", span(a.origin),
                                       did_you_mean(str(v), domain)))
    for b in breakers:
        for m in b.models:
            if m not in models:
                diags.append(error("E414", f"breaker `{b.name}` names unknown model `{m}`", span(b.origin), did_you_mean(m, models)))
        for act in b.actions:
            if isinstance(act, Redirect) and act.backup not in models:
                diags.append(error("E415", f"breaker `{b.name}` redirects to `{act.backup}`, which has no contract", span(b.origin),
                                   did_you_mean(act.backup, models) or "declare the backup model's contract"))
    check_values(contracts, gpus, headers, tenants, breakers, diags)
    check_rules(rules, headers, tenants, diags)
