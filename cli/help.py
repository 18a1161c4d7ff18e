"""Every command's parser made one way: a one-line help, a description, examples and the
exit codes it can return (the codes of `exit_codes.py`), all shown by `policyc CMD --help`."""

from __future__ import annotations

import argparse
from typing import Iterable

from .exit_codes import MEANING, Exit


def epilog(examples: Iterable[str], codes: Iterable[Exit]) -> str:
    ex = "\n".join(f"  {e}" for e in examples)
    cs = "\n".join(f"  {int(c)}  {MEANING[c]}" for c in codes)
    return f"examples:\n{ex}\n\nexit codes:\n{cs}"


def add_command(sub: argparse._SubParsersAction, name: str, *, help: str, examples: Iterable[str],
                codes: Iterable[Exit], description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand parser; `codes` is also kept as the parser's `exit_codes` default so the
    table-driven CLI test can check a command returns only what it declares."""
    codes = tuple(codes)
    p = sub.add_parser(name, help=help, description=description or help[:1].upper() + help[1:] + ".",
                       epilog=epilog(examples, codes), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(exit_codes=codes)
    return p
