"""`policyc diff OLD NEW`: semantic diff of two policy versions, usable as a CI gate.

OLD and NEW are each a compiled bundle (JSON) or policy sources (a directory or
`.contract` files, compiled here; `-` reads a bundle from stdin). Exit codes: 0 equivalent, 3 NEW widens what is admitted
on a security or compliance attribute (TPM, memory encryption, firewall, TEE, region),
4 other differences, 5 the solver could not decide, 1 a version does not compile or load,
2 usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from policyc.compiler.bundle import Bundle

from .exit_codes import Exit
from .help import add_command

EXIT_INPUT = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "diff", help="find requests whose outcome differs between two policy versions",
                    description=__doc__, codes=(Exit.OK, Exit.FAILED, Exit.USAGE, Exit.NEGATIVE, Exit.DIFFERENT, Exit.UNKNOWN),
                    examples=["policyc diff main-bundle.json new-bundle.json",
                              "policyc diff policies/versions/v1 policies/versions/v2 --format json"])
    p.add_argument("old", metavar="OLD", help="bundle file, policy directory or .contract file")
    p.add_argument("new", metavar="NEW", help="bundle file, policy directory or .contract file")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")
    p.add_argument("--max", type=int, default=20, metavar="N", help="list at most N differences (default 20)")
    p.set_defaults(func=run)


def _load(path: str) -> tuple[Bundle | None, str]:
    """The bundle at `path`, or None and the rendered reason it cannot be had."""
    from policyc.compiler import bundle_io
    from policyc.compiler.load import is_directory
    from policyc.compiler.pipeline import compile_paths
    from policyc.dsl.diagnostics import render_text, summary

    if path == "-":
        try:
            return bundle_io.loads(sys.stdin.read(), origin="<stdin>"), ""
        except bundle_io.BundleError as e:
            return None, f"policyc diff: {e}\n"
    p = Path(path)
    if is_directory(p) or p.suffix == ".contract":
        result = compile_paths([p])
        if not result.ok:
            return None, render_text(result.errors, result.sources) + f"{path}: {summary(result.diagnostics)}\n"
        return result.bundle, ""
    try:
        return bundle_io.load(p), ""
    except bundle_io.BundleError as e:
        return None, f"policyc diff: {e}\n"


def run(args: argparse.Namespace) -> int:
    from policyc.solver.diff import diff_bundles
    from policyc.solver.diff_render import render_text, to_json

    if args.max < 1:
        print("policyc diff: --max must be at least 1", file=sys.stderr)
        return 2
    old, why_old = _load(args.old)
    new, why_new = _load(args.new)
    if old is None or new is None:
        sys.stderr.write(why_old + why_new)
        return EXIT_INPUT
    report = diff_bundles(old, new, limit=args.max)
    if args.format == "json":
        print(to_json(report))
    else:
        var_types = {h.var: h.type for b in (old, new) for h in b.headers}
        sys.stdout.write(render_text(report, var_types))
    return report.exit_code
