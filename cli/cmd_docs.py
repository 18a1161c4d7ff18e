"""`policyc docs`: the language reference that ships with the package (docs/language.md).

Prints the reference (to a pager's stdin, a file, or the terminal); `--path` prints where
it lies instead, for an editor or a browser's Markdown viewer; `--examples` prints where
the example policies lie (what `policyc init DIR` copies).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .exit_codes import Exit
from .help import add_command


def reference_path() -> Path:
    """docs/language.md in the installed package (package-data; an editable install reads the checkout's)."""
    import policyc

    return Path(policyc.__file__).resolve().parent / "docs" / "language.md"


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "docs", help="print the language reference (or its path, or where the examples lie)",
                    description=__doc__, codes=(Exit.OK, Exit.FAILED),
                    examples=["policyc docs | less", "policyc docs --path", "ls $(policyc docs --examples)"])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--path", action="store_true", help="print the reference's path instead of its text")
    what.add_argument("--examples", action="store_true", help="print the example policies' folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.examples:
        from .cmd_init import examples_dir

        print(examples_dir())
        return 0
    path = reference_path()
    if not path.is_file():
        print(f"policyc docs: error: {path} is missing from this installation: reinstall policyc", file=sys.stderr)
        return int(Exit.FAILED)
    if args.path:
        print(path)
        return 0
    sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0
