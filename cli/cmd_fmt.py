"""`policyc fmt PATH…`: policies in canonical layout, comments kept, idempotent.

Like `opa fmt` and `cedar format`: prints the formatted text to stdout and changes nothing
unless `-w` rewrites the files in place. `--diff` prints a unified diff instead; `--check`
changes nothing and exits 1 when a file is not formatted (with `--diff`, showing how).
`-` formats stdin to stdout.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from policyc.compiler import load
from policyc.dsl.parser import parse
from policyc.dsl.printer import format_file
from policyc.dsl.source import Source

from .exit_codes import Exit
from .help import add_command
from .inputs import STDIN, read_stdin_source
from .report import print_diagnostics


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "fmt", help="format policies in canonical layout (prints unless -w)", description=__doc__,
                    examples=["policyc fmt policies/fraud-scorer.contract", "policyc fmt -w policies/",
                              "policyc fmt --check --diff policies/", "cat my.contract | policyc fmt -"],
                    codes=(Exit.OK, Exit.FAILED, Exit.USAGE))
    p.add_argument("paths", nargs="+", metavar="PATH", help="`.contract` files or directories (`-`: stdin)")
    p.add_argument("-w", "--write", action="store_true", help="rewrite the files in place")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file is not formatted")
    p.add_argument("--diff", action="store_true", help="print a unified diff instead of the formatted text")
    p.set_defaults(func=run)


def _inputs(paths: list[str]) -> tuple[list[tuple[Path | None, Source]], list]:  # type: ignore[type-arg]
    out: list[tuple[Path | None, Source]] = []
    diags = []
    for raw in paths:
        if raw == STDIN:
            src, more = read_stdin_source()
            diags.extend(more)
            if src is not None:
                out.append((None, src))
            continue
        files, more = load.collect([raw])
        diags.extend(more)
        for f in files:
            src, more = load.read(f)
            diags.extend(more)
            if src is not None:
                out.append((f, src))
    return out, diags


def run(args: argparse.Namespace) -> int:
    if args.write and (args.check or args.diff):
        print("policyc fmt: error: -w rewrites files; --check and --diff change nothing", file=sys.stderr)
        return Exit.USAGE
    if args.write and STDIN in args.paths:
        print("policyc fmt: error: -w cannot rewrite stdin", file=sys.stderr)
        return Exit.USAGE
    inputs, diags = _inputs(args.paths)
    sources = {}
    unformatted: list[str] = []
    for path, src in inputs:
        sources[src.name] = src
        tree, more = parse(src)
        diags.extend(more)
        if tree is None:
            continue
        out = format_file(tree)
        changed = out != src.text
        if changed:
            unformatted.append(src.name)
        if args.diff:
            sys.stdout.writelines(difflib.unified_diff(src.text.splitlines(True), out.splitlines(True),
                                                       src.name, src.name + " (formatted)"))
        elif args.write:
            if changed and path is not None:
                path.write_text(out, encoding="utf-8")
                print(f"formatted {src.name}")
        elif not args.check:
            sys.stdout.write(out)
    print_diagnostics(diags, sources, "text")
    failed = any(d.is_error for d in diags)
    if args.check:
        for name in unformatted:
            print(f"would reformat {name}")
        return Exit.FAILED if unformatted or failed else Exit.OK
    return Exit.FAILED if failed else Exit.OK
