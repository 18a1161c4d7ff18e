"""The layering rules of `DESIGN.md`, held by the imports themselves.

Every module of the product is parsed (not imported) and its imports collected, those
inside functions included (a lazy import is still a dependency) and those under
`if TYPE_CHECKING:` left out (annotations only). Then:

- no import cycle among policyc modules;
- `dsl/` imports nothing of policyc but `dsl/` and the compiler's standard-library leaves
  (`diagnostic`, `meaning`, `limits`), and knows nothing of Z3, gRPC or the kernel;
- the runtime (matcher, placer, server, enforcer, audit, gateway, cluster, modelserver)
  never reaches, however indirectly, `dsl/`, lark or the compiler's front end (the passes
  that read source: pipeline, front_end, load, contracts, catalog, requests, rules,
  breakers, fields): it reads bundles only;
- the solver never reaches `dsl/`, lark, gRPC or the compiler's front end;
- the CLI is imported by nothing below it, and `demo/` (above the CLI) by the CLI alone.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
NOT_PRODUCT = {"tests", "benchmarks", "scripts", "docs", ".venv", ".venv-vllm", ".ci", "policies", ".git", "build"}
RUNTIME = ("matcher", "placer", "server", "enforcer", "audit", "gateway", "cluster", "modelserver")
LEAVES = {"policyc.compiler", "policyc.compiler.diagnostic", "policyc.compiler.meaning", "policyc.compiler.limits"}
FRONT_END = {f"policyc.compiler.{n}" for n in
             ("pipeline", "front_end", "load", "contracts", "catalog", "requests", "rules", "breakers", "fields")}


@cache
def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    # walk only the product's own folders: hidden ones (.venv, .venv-vllm, a benchmark's
    # .venv-routers …) hold gigabytes of other packages' files
    tops = [t for t in ROOT.iterdir() if not t.name.startswith(".") and t.name not in NOT_PRODUCT]
    for p in (q for t in tops for q in ([t] if t.is_file() else t.rglob("*.py"))):
        if p.suffix != ".py":
            continue
        rel = p.relative_to(ROOT)
        if len(rel.parts) == 1 and rel.name != "__init__.py" or "_pb2" in p.name:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["policyc", *parts])] = p
    return out


@cache
def imports_of(name: str) -> frozenset[str]:
    mods = modules()
    path = mods[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    annotations_only = {id(n) for node in ast.walk(tree)
                        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                        for stmt in node.body for n in ast.walk(stmt)}
    got: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            got.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods]
            if len(subs) < len(node.names):
                got.add(mod)
            got.update(subs)
    return frozenset(got)


def reach(name: str) -> set[str]:
    """Every module `name` imports, directly or through policyc modules."""
    mods = modules()
    seen: set[str] = set()
    todo = [name]
    while todo:
        for m in imports_of(todo.pop()):
            if m not in seen:
                seen.add(m)
                if m in mods:
                    todo.append(m)
    return seen


def area(name: str) -> str:
    return name.split(".")[1] if name.count(".") >= 1 else ""


def top(name: str) -> str:
    return name.split(".")[0]


def test_the_scan_sees_the_product():
    mods = modules()
    assert {"policyc.compiler.meaning", "policyc.dsl.parser", "policyc.server.app", "policyc.solver.analyse",
            "policyc.cli.main"} <= set(mods)
    assert "lark" in imports_of("policyc.dsl.parser")


def test_no_import_cycles():
    mods = modules()
    graph = {m: sorted(x for x in imports_of(m) if x in mods) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:  # Tarjan's strongly connected components, iteratively deep enough here
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_dsl_knows_only_itself_and_the_compiler_leaves():
    bad = {}
    for m in modules():
        if area(m) != "dsl":
            continue
        wrong = sorted(x for x in imports_of(m) if top(x) == "policyc" and area(x) != "dsl" and x not in LEAVES)
        wrong += sorted(x for x in reach(m) if top(x) in ("z3", "grpc", "bcc", "pyroute2"))
        if wrong:
            bad[m] = wrong
    assert not bad, bad


def test_the_runtime_reads_bundles_only():
    bad = {}
    for m in modules():
        if area(m) not in RUNTIME:
            continue
        wrong = sorted(x for x in reach(m) if x.startswith("policyc.dsl") or top(x) in ("lark", "lark_cython") or x in FRONT_END)
        if wrong:
            bad[m] = wrong
    assert not bad, bad


def test_the_solver_reads_the_ir_only():
    bad = {}
    for m in modules():
        if area(m) != "solver":
            continue
        wrong = sorted(x for x in reach(m) if x.startswith("policyc.dsl") or top(x) in ("lark", "lark_cython", "grpc")
                       or x in FRONT_END)
        if wrong:
            bad[m] = wrong
    assert not bad, bad


def test_the_cli_and_the_demo_are_on_top():
    bad = []
    for m in modules():
        for x in imports_of(m):
            if (x == "policyc.cli" or x.startswith("policyc.cli.")) and area(m) not in ("cli", "demo"):
                bad.append((m, x))
            if (x == "policyc.demo" or x.startswith("policyc.demo.")) and area(m) not in ("cli", "demo"):
                bad.append((m, x))
    assert not bad, bad
