"""`policyc fmt PATH… [--check]`: rewrite policies in canonical layout."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from policyc.compiler import load
from policyc.dsl.parser import parse
from policyc.dsl.printer import format_file

from .report import print_diagnostics


def register(sub) -> None:
    p = sub.add_parser("fmt", help="format policies in canonical layout")
    p.add_argument("paths", nargs="+", help="`.contract` files or directories")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file is not formatted")
    p.add_argument("--diff", action="store_true", help="with --check, show what would change")
    p.set_defaults(func=run)


def run(args) -> int:
    files, diags = load.collect(args.paths)
    sources = {}
    unformatted: list[str] = []
    for path in files:
        src, more = load.read(path)
        diags.extend(more)
        if src is None:
            continue
        sources[src.name] = src
        tree, more = parse(src)
        diags.extend(more)
        if tree is None:
            continue
        out = format_file(tree)
        if out == src.text:
            continue
        unformatted.append(src.name)
        if args.check:
            if args.diff:
                sys.stdout.writelines(difflib.unified_diff(src.text.splitlines(True), out.splitlines(True),
                                                           src.name, src.name + " (formatted)"))
        else:
            Path(path).write_text(out, encoding="utf-8")
    print_diagnostics(diags, sources, "text")
    if args.check:
        for name in unformatted:
            print(f"would reformat {name}")
        return 1 if unformatted or any(d.is_error for d in diags) else 0
    for name in unformatted:
        print(f"formatted {name}")
    return 1 if any(d.is_error for d in diags) else 0
