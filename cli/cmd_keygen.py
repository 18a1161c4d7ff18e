"""`policyc keygen NAME`: an ed25519 key pair for signing bundles (NAME.key, NAME.pub)."""

from __future__ import annotations

import sys

from .exit_codes import Exit
from .help import add_command
from .keys import generate


def register(sub) -> None:  # type: ignore[no-untyped-def]
    p = add_command(sub, "keygen", help="create an ed25519 key pair for signing bundles", codes=(Exit.OK, Exit.USAGE),
                    examples=["policyc keygen ops   # writes ops.key and ops.pub", "policyc compile policies/ -o b.json --sign ops.key"])
    p.add_argument("name", help="writes NAME.key (private, mode 600) and NAME.pub")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        generate(args.name + ".key", args.name + ".pub")
    except OSError as e:
        print(f"policyc: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.name}.key and {args.name}.pub")
    return 0
