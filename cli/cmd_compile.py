"""`policyc compile PATH… -o bundle.json [--sign KEY]`: emit the verified bundle.

Reports the bundle's path and sha256 (`--format json`: one document with both and the
diagnostics). `-o -` writes the bundle to stdout (the report then goes to stderr); `-`
as a PATH reads a policy from stdin.
"""

from __future__ import annotations

import argparse
import json
import sys

from policyc.compiler import bundle_io

from .compiling import compile_inputs
from .exit_codes import Exit
from .help import add_command
from .keys import KeyError_, load_private
from .report import add_format_flag, print_diagnostics


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "compile", help="compile policies into a bundle", description=__doc__,
                    examples=["policyc compile policies/ -o bundle.json", "policyc compile policies/ -o bundle.json --sign ops.key",
                              "policyc compile policies/ -o - | policyc inspect -"],
                    codes=(Exit.OK, Exit.FAILED, Exit.USAGE))
    p.add_argument("paths", nargs="+", metavar="PATH", help="`.contract` files or directories (`-`: stdin)")
    p.add_argument("-o", "--output", required=True, help="bundle file to write (`-`: stdout)")
    p.add_argument("--sign", metavar="KEY", help="ed25519 private key (PEM) to sign the bundle with")
    add_format_flag(p)
    p.set_defaults(func=run)


def _diag_list(result) -> list:  # type: ignore[no-untyped-def]
    from policyc.dsl.diagnostics import render_json

    return json.loads(render_json(result.diagnostics))


def run(args: argparse.Namespace) -> int:
    if args.output == "-" and args.format == "json":
        print("policyc compile: error: `-o -` writes the bundle to stdout; it cannot carry a JSON report too", file=sys.stderr)
        return Exit.USAGE
    key = None
    if args.sign:
        try:
            key = load_private(args.sign)
        except KeyError_ as e:
            print(f"policyc: error: {e}", file=sys.stderr)
            return Exit.USAGE
    result = compile_inputs(args.paths)
    if args.format == "text":
        print_diagnostics(result.diagnostics, result.sources, "text")
    if not result.ok or result.bundle is None:
        if args.format == "json":
            print(json.dumps({"ok": False, "bundle": None, "diagnostics": _diag_list(result)}, indent=1, sort_keys=True))
        return Exit.FAILED
    bundle = bundle_io.sign(result.bundle, key) if key else result.bundle
    try:
        if args.output == "-":
            sys.stdout.write(bundle_io.dumps(bundle))
            sys.stdout.flush()
        else:
            bundle_io.write(bundle, args.output)
    except OSError as e:
        print(f"policyc: error: cannot write `{args.output}`: {e.strerror}", file=sys.stderr)
        return Exit.USAGE
    if args.format == "json":
        print(json.dumps({"ok": True, "bundle": {"path": args.output, "content_hash": bundle.content_hash,
                                                 "signed": key is not None, "contracts": len(bundle.contracts),
                                                 "rules": len(bundle.rules), "breakers": len(bundle.breakers)},
                          "diagnostics": _diag_list(result)}, indent=1, sort_keys=True))
    else:
        print(f"wrote {args.output} ({bundle.content_hash}{', signed' if key else ''})",
              file=sys.stderr if args.output == "-" else sys.stdout)
    return Exit.OK

