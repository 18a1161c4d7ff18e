"""The compiler as data: `STAGES`, a sequence of (name, function) run in order over one
`Compilation`: parse → lower → resolve → plan → analyse → emit.

Each stage reads what the previous ones left and appends diagnostics; the next runs only
while there are no errors, so one run reports every error a stage can find without
cascading noise. `stop_after` returns after a named stage, with the (unsealed) bundle from
`plan` on. The analyse stage is the solver's (`policyc.solver.analyse`), which reads only
the compiler's IR modules (`bundle`, `meaning`, `semantics`), never this one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from policyc import __version__
from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, sort_key
from policyc.dsl.source import Source
from policyc.solver.analyse import analyse as solver_analyse

from . import bundle_io, load
from .attributes import BUILTIN_REQUEST_VARS
from .bundle import Bundle, Var
from .front_end import Lowered, front_end
from .gc_pause import gc_paused
from .index import plan_index
from .meaning import latency_targets
from .resolve import resolve
from .rules import RequestScope, lower_policy
from .semantics import atoms

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
    """Run the stages over `sources`. `analyse=False` skips the solver's stage (the bundle
    then has no GPU-share bounds); `stop_after` names the last stage to run (one of
    STAGE_NAMES) and returns its (unsealed, from `plan` on) bundle. Raises ValueError for a
    stage name that does not exist."""
    if stop_after is not None and stop_after not in STAGE_NAMES:
        raise ValueError(f"no compiler stage `{stop_after}`; the stages are {', '.join(STAGE_NAMES)}")
    if stop_after == "analyse" and not analyse:
        raise ValueError("`stop_after='analyse'` with `analyse=False`: the analyse stage would not run")
    with gc_paused():
        c = Compilation({s.name: s for s in sources}, analyse)
        for name, run in STAGES:
            if any(d.is_error for d in c.diags) and (name not in GATHERING or _unparsed(c)):
                break
            run(c)
            if name == stop_after:
                break
        c.diags = _without_echoes(c.diags)
        c.diags.sort(key=sort_key)
        errors = any(d.is_error for d in c.diags)
        return CompileResult(None if errors else c.bundle, c.diags, c.sources)


@dataclass
class Compilation:
    """What the stages hand on: the sources, every diagnostic so far, the declarations as
    lowered, and the bundle from `plan` on."""

    sources: dict[str, Source]
    analyse: bool
    diags: list[Diagnostic] = field(default_factory=list)
    low: Lowered = field(default_factory=Lowered)
    policies: list[ast.Block] = field(default_factory=list)
    bundle: Bundle | None = None


def parse(c: Compilation) -> None:
    """Parse each file and lower its declarations (files are independent until names resolve)."""
    for unit in front_end(list(c.sources.values())):
        c.diags.extend(unit.diagnostics)
        c.low.extend(unit.lowered)
        c.policies.extend(unit.policies)


def lower(c: Compilation) -> None:
    """Lower the request policies, which may use headers and tenants from any file."""
    lower_policies(c.policies, c.low, c.diags)


def resolve_names(c: Compilation) -> None:
    low = c.low
    resolve(low.contracts, low.gpus, low.headers, low.tenants, low.rules, low.breakers, c.diags)


def plan(c: Compilation) -> None:
    """The index plan, the latency targets, and the bundle in canonical order."""
    low = c.low
    c.bundle = Bundle(
        compiler_version=__version__,
        contracts=tuple(sorted(low.contracts, key=lambda x: x.name)),
        gpu_catalog=tuple(sorted(low.gpus, key=lambda g: g.name)),
        headers=tuple(sorted(low.headers, key=lambda h: h.header.lower())),
        tenants=tuple(sorted(low.tenants, key=lambda t: t.name)),
        rules=tuple(low.rules),
        index_plan=plan_index(low.rules, low.headers),
        breakers=tuple(sorted(low.breakers, key=lambda x: x.name)),
        latency_targets=latency_targets(
            (a.attr, a.cmp, a.operand.name if isinstance(a.operand, Var) else None)
            for r in low.rules for a in atoms(r.require)),
    )


def analyse(c: Compilation) -> None:
    """The solver: feasibility, GPU-share bounds, rule analyses (skipped with analyse=False)."""
    if c.analyse and c.bundle is not None:
        c.bundle, more = solver_analyse(c.bundle)
        c.diags.extend(more)


def emit(c: Compilation) -> None:
    """Seal: canonical bytes and content hash."""
    if c.bundle is not None:
        c.bundle = bundle_io.seal(c.bundle)


def _unparsed(c: Compilation) -> bool:
    """A file that did not parse (a syntax error other than a repaired unknown unit) lowers
    to nothing, so the later stages would report its names as unknown: they wait."""
    return any(d.is_error and d.code.startswith("E1") and d.code != "E109" for d in c.diags)


def _without_echoes(diags: list[Diagnostic]) -> list[Diagnostic]:
    """An unknown unit was blanked to parse on (dsl/parser.py), so the value before it reads
    as a plain number and lowering says so: that echo of the E109 beside it is dropped."""
    units = {(d.span.file, d.span.line, d.span.col) for d in diags if d.code == "E109" and d.span is not None}
    if not units:
        return diags

    def echo(d: Diagnostic) -> bool:
        s = d.span
        return (d.code != "E109" and s is not None and s.line == s.end_line
                and any((s.file, s.line, col) in units for col in range(s.end_col, s.end_col + 3)))
    return [d for d in diags if not echo(d)]


Stage = tuple[str, Callable[[Compilation], None]]
STAGES: tuple[Stage, ...] = (
    ("parse", parse), ("lower", lower), ("resolve", resolve_names), ("plan", plan), ("analyse", analyse), ("emit", emit),
)
STAGE_NAMES: tuple[str, ...] = tuple(name for name, _ in STAGES)
# the stages that run past errors, so that one run reports every error they can find (each
# works on what lowered cleanly); from `plan` on, a stage needs an error-free program
GATHERING: frozenset[str] = frozenset({"parse", "lower", "resolve"})


def lower_policies(policies: list[ast.Block], low: Lowered, diags: list[Diagnostic]) -> None:
    """Rules are checked against the request variables and tenant classes of all files."""
    scope = RequestScope(
        vars={**BUILTIN_REQUEST_VARS, **{h.var: h.type for h in low.headers}},
        values={h.var: h.values for h in low.headers if h.values},
        tenant_classes=tuple(sorted({t.tenant_class for t in low.tenants})),
    )
    for p in policies:
        low.rules.extend(lower_policy(p, scope, diags))


__all__ = ["CompileResult", "Compilation", "compile_paths", "compile_sources", "lower_policies", "STAGES", "STAGE_NAMES"]
