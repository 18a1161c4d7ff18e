"""`policyc compile PATH… -o bundle.json [--sign KEY]`: emit the verified bundle."""

from __future__ import annotations

import sys

from policyc.compiler import bundle_io
from policyc.compiler.pipeline import compile_paths

from .keys import KeyError_, load_private
from .report import add_format_flag, print_diagnostics


def register(sub) -> None:
    p = sub.add_parser("compile", help="compile policies into a bundle")
    p.add_argument("paths", nargs="+", help="`.contract` files or directories")
    p.add_argument("-o", "--output", required=True, help="bundle file to write")
    p.add_argument("--sign", metavar="KEY", help="ed25519 private key (PEM) to sign the bundle with")
    add_format_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    key = None
    if args.sign:
        try:
            key = load_private(args.sign)
        except KeyError_ as e:
            print(f"policyc: error: {e}", file=sys.stderr)
            return 2
    result = compile_paths(args.paths)
    print_diagnostics(result.diagnostics, result.sources, args.format)
    if not result.ok:
        return 1
    bundle = bundle_io.sign(result.bundle, key) if key else result.bundle
    try:
        bundle_io.write(bundle, args.output)
    except OSError as e:
        print(f"policyc: error: cannot write `{args.output}`: {e.strerror}", file=sys.stderr)
        return 2
    if args.format == "text":
        print(f"wrote {args.output} ({bundle.content_hash}{', signed' if key else ''})")
    return 0
