"""`policyc lsp`: the language server, speaking the Language Server Protocol on stdin and
stdout (point an editor's LSP client at this command for `.contract` files).

Diagnostics as you type (the compiler's, with the other files of the folder), hover with a
field's meaning and unit, completion of fields, names and units, go to definition for
models and rules, formatting through `policyc fmt`. Needs the `lsp` extra
(`pip install 'policyc[lsp]'`).
"""

from __future__ import annotations

import argparse

from .exit_codes import Exit
from .help import add_command


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "lsp", help="run the language server on stdio (for editors)", description=__doc__,
                    codes=(Exit.OK, Exit.USAGE), examples=["policyc lsp   # started by the editor, not by hand"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .extras import require

    require("lsp", command="lsp")
    from policyc.lsp.server import main

    main()
    return 0
