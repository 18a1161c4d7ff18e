"""`policyc`: one entry point, one module per subcommand.

Each `cli/cmd_<name>.py` exposes `register(subparsers)` that adds its parser and sets
`func` to a function taking the parsed args and returning an exit code. Modules are found
by name, so adding a command is adding a file. One exit-code table holds for every command
(`exit_codes.py`, printed by `policyc --help`); each command's help lists the codes it uses.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import NoReturn

from policyc import __version__

from .exit_codes import Exit, table_text

EXIT_OK, EXIT_POLICY, EXIT_USAGE = Exit.OK, Exit.FAILED, Exit.USAGE


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors exit 2 with a one-line reason
        self.print_usage(sys.stderr)
        print(f"policyc: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="policyc", description="Declarative policy engine for serving ML models.",
                     epilog=table_text() + "\n\n`policyc COMMAND --help` shows a command's options and examples.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"policyc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    import policyc.cli as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"policyc.cli.{info.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from . import config_file

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    config_file.install(parser)  # --config FILE / POLICYC_<COMMAND>_<FLAG> for serve, gateway, agent run
    config_file.prepare(parser, argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        if getattr(args, "print_config", False):
            return config_file.print_config(args, parser, argv)
        return int(args.func(args))
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
