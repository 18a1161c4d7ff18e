"""`policyc check PATH…`: parse, check and analyse policies without writing a bundle."""

from __future__ import annotations

from policyc.compiler.pipeline import compile_paths

from .report import add_format_flag, print_diagnostics


def register(sub) -> None:
    p = sub.add_parser("check", help="check policies and report every problem")
    p.add_argument("paths", nargs="+", help="`.contract` files or directories")
    add_format_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    result = compile_paths(args.paths)
    print_diagnostics(result.diagnostics, result.sources, args.format)
    if result.ok and args.format == "text":
        b = result.bundle
        print(f"ok: {len(b.contracts)} contracts, {len(b.rules)} rules, {len(b.breakers)} breakers, "
              f"{len(b.gpu_catalog)} GPU classes")
    return 0 if result.ok else 1
