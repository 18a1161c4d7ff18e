"""`policyc reload bundle.json`: swap the running service to a new bundle, atomically.

The bundle is read here and sent inline (`-` reads stdin), or with `--server-path` the
service loads a path on its own machine. Instances the new bundle no longer admits are
refused unless `--evict` removes them.
"""

from __future__ import annotations

import argparse
import json

from .connection import SetupError, add_connection_flags, connect, fail, usage
from .exit_codes import Exit
from .help import add_command
from .inputs import read_text


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "reload", help="make the running decision service load a new bundle", description=__doc__,
                    examples=["policyc reload bundle.json", "policyc compile policies -o - | policyc reload -",
                              "policyc reload --server-path /srv/policyc/bundle.json --evict"],
                    codes=(Exit.OK, Exit.USAGE, Exit.UNAVAILABLE, Exit.REFUSED))
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help="bundle file to send (`-`: stdin)")
    p.add_argument("--server-path", metavar="PATH", help="a bundle path on the server's machine instead")
    p.add_argument("--evict", action="store_true", help="deregister instances the new bundle does not admit")
    add_connection_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from policyc.client import ClientError

    if bool(args.bundle) == bool(args.server_path):
        return usage("reload", "give a BUNDLE file or --server-path, not both")
    text = None
    if args.bundle:
        try:
            text = read_text(args.bundle)
        except (OSError, UnicodeDecodeError) as e:
            return usage("reload", f"{args.bundle}: cannot read: {getattr(e, 'strerror', None) or e}")
    try:
        client = connect(args)
    except SetupError as e:
        return usage("reload", str(e))
    with client:
        try:
            r = client.reload(bundle_json=text, path=args.server_path, evict_inadmissible=args.evict)
        except ClientError as e:
            return fail("reload", args, e)
    if args.format == "json":
        print(json.dumps({"ok": True, "previous_hash": r.previous_hash, "bundle_hash": r.bundle_hash,
                          "evicted": list(r.evicted), "registry_size": r.registry_size}, indent=1, sort_keys=True))
    else:
        print(f"reloaded: {r.previous_hash} -> {r.bundle_hash}; {r.registry_size} instances"
              + (f", evicted {', '.join(r.evicted)}" if r.evicted else ""))
    return Exit.OK
