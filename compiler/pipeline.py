"""The compiler as a list of named stages: parse → lower → resolve → plan → analyse → emit.

Each stage reads the previous stage's output and appends diagnostics; later stages run
only while there are no errors, so one run reports every error a stage can find without
cascading noise. `stop_after` returns after a named stage, with the (unsealed) bundle from
`plan` on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from policyc import __version__
from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, sort_key
from policyc.dsl.source import Source

from . import bundle_io, load
from .attributes import BUILTIN_REQUEST_VARS
from .bundle import Bundle
from .front_end import Lowered, front_end
from .gc_pause import gc_paused
from .index import plan_index
from .resolve import resolve
from .rules import RequestScope, lower_policy

STAGES = ("parse", "lower", "resolve", "plan", "analyse", "emit")


@dataclass
class CompileResult:
    bundle: Bundle | None
    diagnostics: list[Diagnostic]
    sources: dict[str, Source] = field(default_factory=dict)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def ok(self) -> bool:
        return self.bundle is not None and not self.errors


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
    with gc_paused():
        return _compile_sources(sources, analyse=analyse, stop_after=stop_after)


def _compile_sources(sources: Sequence[Source], *, analyse: bool, stop_after: str | None) -> CompileResult:
    diags: list[Diagnostic] = []
    result = CompileResult(None, diags, {s.name: s for s in sources})
    # parse, and lower each file's declarations (files are independent until names resolve)
    units = front_end(sources)
    low, policies = Lowered(), []
    for unit in units:
        diags.extend(unit.diagnostics)
        low.extend(unit.lowered)
        policies.extend(unit.policies)
    if _stop(result, "parse", stop_after):
        return _done(result)
    # lower the request policies, which may use headers and tenants from any file
    lower_policies(policies, low, diags)
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
            result.bundle = b
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


def lower_policies(policies: list[ast.Block], low: Lowered, diags: list[Diagnostic]) -> None:
    """Rules are checked against the request variables and tenant classes of all files."""
    scope = RequestScope(
        vars={**BUILTIN_REQUEST_VARS, **{h.var: h.type for h in low.headers}},
        values={h.var: h.values for h in low.headers if h.values},
        tenant_classes=tuple(sorted({t.tenant_class for t in low.tenants})),
    )
    for p in policies:
        low.rules.extend(lower_policy(p, scope, diags))


__all__ = ["CompileResult", "compile_paths", "compile_sources", "lower_policies", "STAGES"]
