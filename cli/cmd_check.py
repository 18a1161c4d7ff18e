"""`policyc check PATH…`: parse, check and analyse policies without writing a bundle.

Every error of the run is printed as `file:line:col`, the source line and a caret; with
`--format json` the diagnostics are one JSON list on stdout. `-` reads a policy from stdin.
"""

from __future__ import annotations

import argparse

from .compiling import compile_inputs
from .exit_codes import Exit
from .help import add_command
from .report import add_format_flag, print_diagnostics


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "check", help="check policies and report every problem", description=__doc__,
                    examples=["policyc check policies/", "policyc check --format json policies/fraud-scorer.contract",
                              "cat my.contract | policyc check -"],
                    codes=(Exit.OK, Exit.FAILED, Exit.USAGE))
    p.add_argument("paths", nargs="+", metavar="PATH", help="`.contract` files or directories (`-`: stdin)")
    add_format_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = compile_inputs(args.paths)
    print_diagnostics(result.diagnostics, result.sources, args.format)
    if result.ok and args.format == "text":
        b = result.bundle
        assert b is not None
        print(f"ok: {len(b.contracts)} contracts, {len(b.rules)} rules, {len(b.breakers)} breakers, "
              f"{len(b.gpu_catalog)} GPU classes")
    return Exit.OK if result.ok else Exit.FAILED
