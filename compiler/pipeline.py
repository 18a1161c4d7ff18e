"""The compiler as a list of named stages: parse → lower → resolve → plan → analyse → emit.

Each stage reads the previous stage's output and appends diagnostics; later stages run
only while there are no errors, so one run reports every error a stage can find without
cascading noise. `stop_after` lets tests look at the result of a named stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from policyc import __version__
from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, error, sort_key
from policyc.dsl.parser import parse
from policyc.dsl.source import Source

from . import bundle_io, load
from .attributes import BUILTIN_REQUEST_VARS
from .breakers import lower_breaker
from .bundle import Breaker, Bundle, Contract, GpuClass, HeaderMapping, RequestRule, Tenant
from .catalog import lower_gpu
from .contracts import lower_contract
from .fields import BlockReader
from .index import plan_index
from .requests import lower_request, lower_tenants
from .resolve import resolve
from .rules import RequestScope, lower_policy

TOP_LEVEL = ("contract", "gpu", "request", "tenants", "policy", "breaker")
STAGES = ("parse", "lower", "resolve", "plan", "analyse", "emit")


@dataclass
class CompileResult:
    bundle: Bundle | None
    diagnostics: list[Diagnostic]
    sources: dict[str, Source] = field(default_factory=dict)
    files: list[ast.File] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def ok(self) -> bool:
        return self.bundle is not None and not self.errors


@dataclass
class _Lowered:
    contracts: list[Contract] = field(default_factory=list)
    gpus: list[GpuClass] = field(default_factory=list)
    headers: list[HeaderMapping] = field(default_factory=list)
    tenants: list[Tenant] = field(default_factory=list)
    rules: list[RequestRule] = field(default_factory=list)
    breakers: list[Breaker] = field(default_factory=list)


def compile_paths(paths: Sequence[str | Path], *, analyse: bool = True, stop_after: str | None = None) -> CompileResult:
    files, diags = load.collect(paths)
    sources: list[Source] = []
    for f in files:
        src, more = load.read(f)
        diags.extend(more)
        if src is not None:
            sources.append(src)
    if any(d.is_error for d in diags):
        return CompileResult(None, diags, {s.name: s for s in sources})
    result = compile_sources(sources, analyse=analyse, stop_after=stop_after)
    result.diagnostics[:0] = diags
    return result


def compile_sources(sources: Sequence[Source], *, analyse: bool = True, stop_after: str | None = None) -> CompileResult:
    diags: list[Diagnostic] = []
    result = CompileResult(None, diags, {s.name: s for s in sources})
    # parse
    for src in sources:
        tree, more = parse(src)
        diags.extend(more)
        if tree is not None:
            result.files.append(tree)
    if _stop(result, "parse", stop_after):
        return _done(result)
    # lower
    low = lower(result.files, diags)
    if _stop(result, "lower", stop_after):
        return _done(result)
    # resolve
    resolve(low.contracts, low.gpus, low.headers, low.tenants, low.rules, low.breakers, diags)
    if _stop(result, "resolve", stop_after):
        return _done(result)
    # plan
    index_plan = plan_index(low.rules, low.headers)
    b = Bundle(
        compiler_version=__version__,
        contracts=tuple(sorted(low.contracts, key=lambda c: c.name)),
        gpu_catalog=tuple(sorted(low.gpus, key=lambda g: g.name)),
        headers=tuple(sorted(low.headers, key=lambda h: h.header.lower())),
        tenants=tuple(sorted(low.tenants, key=lambda t: t.name)),
        rules=tuple(low.rules),
        index_plan=index_plan,
        breakers=tuple(sorted(low.breakers, key=lambda x: x.name)),
    )
    if _stop(result, "plan", stop_after):
        result.bundle = b
        return _done(result)
    # analyse (the solver: feasibility, GPU-share bounds, shadowed rules)
    if analyse:
        from policyc.solver.analyse import analyse as solver_analyse

        b, more = solver_analyse(b)
        diags.extend(more)
        if _stop(result, "analyse", stop_after):
            return _done(result)
    # emit
    result.bundle = bundle_io.seal(b)
    return _done(result)


def _stop(result: CompileResult, stage: str, stop_after: str | None) -> bool:
    return any(d.is_error for d in result.diagnostics) or stage == stop_after


def _done(result: CompileResult) -> CompileResult:
    result.diagnostics.sort(key=sort_key)
    if any(d.is_error for d in result.diagnostics):
        result.bundle = None
    return result


def lower(files: list[ast.File], diags: list[Diagnostic]) -> _Lowered:
    """Give every top-level block its meaning. Request variables are gathered first so
    rules in any file can use headers declared in any other."""
    low = _Lowered()
    policies: list[ast.Block] = []
    for f in files:
        for item in f.items:
            if isinstance(item, ast.Field):
                diags.append(error("E213", f"`{item.key}:` must be inside a block", item.key_span,
                                   f"top-level blocks: {', '.join(TOP_LEVEL)}"))
                continue
            kind = item.kind
            if kind == "contract":
                c = lower_contract(item, diags)
                if c:
                    low.contracts.append(c)
            elif kind == "gpu":
                g = lower_gpu(item, diags)
                if g:
                    low.gpus.append(g)
            elif kind == "request":
                low.headers.extend(lower_request(item, diags))
            elif kind == "tenants":
                low.tenants.extend(lower_tenants(item, diags))
            elif kind == "policy":
                policies.append(item)
            elif kind == "breaker":
                b = lower_breaker(item, diags)
                if b:
                    low.breakers.append(b)
            else:
                from policyc.dsl.diagnostics import did_you_mean

                diags.append(error("E214", f"unknown block `{kind}`", item.kind_span,
                                   did_you_mean(kind, TOP_LEVEL) or f"top-level blocks: {', '.join(TOP_LEVEL)}"))
    scope = RequestScope(
        vars={**BUILTIN_REQUEST_VARS, **{h.var: h.type for h in low.headers}},
        values={h.var: h.values for h in low.headers if h.values},
        tenant_classes=tuple(sorted({t.tenant_class for t in low.tenants})),
    )
    for p in policies:
        low.rules.extend(lower_policy(p, scope, diags))
    return low


__all__ = ["CompileResult", "compile_paths", "compile_sources", "lower", "STAGES", "BlockReader"]
