"""`policyc test [PATH…]`: run policy authors' test files against the compiled policies.

Compiles the `.contract` files of PATH (default `policies`), or loads `--bundle`, and runs
every `*_test.toml` directly in PATH or in PATH/tests (or the files given with `--tests`).
`--coverage` lists the rules no case exercised. Exit codes: 0 all passed, 1 a failed case,
a broken test file or policy errors, 2 usage errors. `--format json` prints one document
(the diagnostics, the cases, the coverage); `-` reads the policies from stdin.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from policyc.compiler import bundle_io
from policyc.compiler.diagnostic import sort_key

from .compiling import compile_inputs
from .exit_codes import Exit
from .help import add_command
from .report import add_format_flag, print_diagnostics

if TYPE_CHECKING:
    from policyc.matcher.policy_tests import TestFileError


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "test", help="run policy test files (fleet, requests, expected outcomes)", description=__doc__,
                    examples=["policyc test", "policyc test policies/ --coverage",
                              "policyc test policies/ --tests policies/tests/routing_test.toml --format json"],
                    codes=(Exit.OK, Exit.FAILED, Exit.USAGE))
    p.add_argument("paths", nargs="*", default=["policies"], help="`.contract` files or directories (default: policies; `-`: stdin)")
    p.add_argument("--bundle", help="test this compiled bundle instead of compiling PATHs")
    p.add_argument("--tests", nargs="+", metavar="FILE", help="test files (default: *_test.toml in PATH and PATH/tests)")
    p.add_argument("--coverage", action="store_true", help="list the rules no test case exercised")
    add_format_flag(p)
    p.set_defaults(func=run)


def _test_files(paths: list[str]) -> list[Path]:
    from policyc.compiler.load import is_directory

    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if is_directory(p):  # one that cannot be searched is reported by the compile that follows
            out += sorted(p.glob("*_test.toml")) + sorted((p / "tests").glob("*_test.toml"))
    return out


def _fail_json(message: str, diagnostics: list) -> int:  # type: ignore[type-arg]
    print(json.dumps({"ok": False, "error": message, "diagnostics": diagnostics, "passed": 0, "failed": 0, "cases": []},
                     indent=1, sort_keys=True))
    return Exit.FAILED


def render_test_file_error(e: TestFileError) -> str:
    """A test file's problems as the compiler prints its own: source line, caret, help."""
    from policyc.dsl.diagnostics import render_text
    from policyc.dsl.source import Source

    if not e.diagnostics:
        return str(e)
    return render_text(sorted(e.diagnostics, key=sort_key), {e.path: Source(e.path, e.text)}).rstrip("\n")


def run(args: argparse.Namespace) -> int:
    from policyc.dsl.diagnostics import render_json
    from policyc.matcher.policy_tests import run_files

    diagnostics: list = []  # type: ignore[type-arg]
    if args.bundle:
        try:
            bundle = bundle_io.loads(Path(args.bundle).read_text(encoding="utf-8"), origin=args.bundle)
        except (OSError, bundle_io.BundleError) as e:
            if args.format == "json":
                return _fail_json(f"policyc test: {e}", [])
            print(f"policyc test: {e}", flush=True)
            return Exit.FAILED
    else:
        result = compile_inputs(args.paths, analyse=False)
        if args.format == "json":
            diagnostics = json.loads(render_json(result.diagnostics))
        else:
            print_diagnostics(result.diagnostics, result.sources, args.format)
        if not result.ok or result.bundle is None:
            return _fail_json("the policies do not compile", diagnostics) if args.format == "json" else Exit.FAILED
        bundle = result.bundle
    files = [Path(f) for f in args.tests] if args.tests else _test_files(args.paths)
    if not files:
        if args.format == "json":
            return _fail_json("no `*_test.toml` files found", diagnostics)
        print("policyc test: no `*_test.toml` files found", flush=True)
        return Exit.FAILED
    report = run_files(bundle, files, render_test_file_error)
    failed = [r for r in report.results if not r.passed]
    if args.format == "json":
        print(json.dumps({
            "ok": report.ok, "diagnostics": diagnostics,
            "passed": len(report.results) - len(failed), "failed": len(failed), "errors": list(report.errors),
            "cases": [{"file": r.file, "name": r.name, "passed": r.passed, "failures": list(r.failures),
                       "rules_applied": list(r.applied)} for r in report.results],
            "coverage": {"rules": report.rules, "exercised": report.rules - len(report.uncovered),
                         "uncovered": [{"id": r.id, "origin": str(r.origin)} for r in report.uncovered]},
        }, indent=1, sort_keys=True))
    else:
        for problem in report.errors:  # a test file's problems come located and rendered (`file:line:col: error[E8xx]`)
            print(problem if "error[E" in problem.split("\n", 1)[0] else f"error: {problem}")
        for r in report.results:
            print(f"{'PASS' if r.passed else 'FAIL'}: {r.file}: {r.name}")
            for f in r.failures:
                print(f"    {f}")
        print(f"{len(report.results) - len(failed)} passed, {len(failed)} failed"
              + (f", {len(report.errors)} file error(s)" if report.errors else ""))
        if args.coverage:
            covered = report.rules - len(report.uncovered)
            print(f"coverage: {covered}/{report.rules} rules exercised")
            for rule in report.uncovered:
                print(f"  not exercised: {rule.id} ({rule.origin})")
    return Exit.OK if report.ok else Exit.FAILED
