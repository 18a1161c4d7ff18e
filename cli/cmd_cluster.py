"""`policyc cluster status|rollout --etcd URL…`: what the replicas sharing a fleet run,
and rolling a bundle out to all of them.

`status` shows the etcd members, the elected leader and its fencing token, the bundle in
force, each replica (address, bundle, lag in revisions, lease and its TTL left) and the
shared state. `rollout BUNDLE` stores the bundle under its hash and swaps the pointer by
compare-and-swap (`--expect HASH`: only if that bundle is in force); every replica
verifies it before it swaps. Exit codes: 0 ok; 1 the rollout lost its compare-and-swap;
2 usage or a bad bundle; 6 etcd could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from policyc.cluster.keys import DEFAULT_PREFIX

from .exit_codes import Exit
from .help import add_command


CODES = (Exit.OK, Exit.FAILED, Exit.USAGE, Exit.UNAVAILABLE)


def register(sub) -> None:  # type: ignore[no-untyped-def]
    p = add_command(sub, "cluster", help="replicas sharing one fleet through etcd: status, rollout", codes=CODES,
                    description=__doc__, examples=["policyc cluster status --etcd http://10.0.0.1:2379 http://10.0.0.2:2379",
                                                   "policyc cluster rollout bundle.json --etcd http://10.0.0.1:2379"])
    csub = p.add_subparsers(dest="cluster_command", metavar="ACTION", parser_class=type(p))
    s = add_command(csub, "status", help="replicas, their bundles, leases, the leader and lag", codes=CODES,
                    examples=["policyc cluster status --etcd http://127.0.0.1:2379 --format json"])
    _store_flags(s)
    s.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")
    s.set_defaults(func=_status)
    r = add_command(csub, "rollout", help="make a bundle the one in force on every replica", codes=CODES,
                    examples=["policyc cluster rollout new.json --etcd http://127.0.0.1:2379 --expect sha256:…"])
    _store_flags(r)
    r.add_argument("bundle", help="compiled bundle (policyc compile … -o bundle.json)")
    r.add_argument("--public-key", help="check the bundle's signature here first (each replica checks again)")
    r.add_argument("--expect", metavar="HASH", help="only if this bundle is in force (compare-and-swap)")
    r.set_defaults(func=_rollout)
    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return int(Exit.USAGE)
    p.set_defaults(func=usage)


def _store_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd", nargs="+", required=True, metavar="URL", help="etcd endpoints")
    p.add_argument("--etcd-prefix", default=DEFAULT_PREFIX, help=f"the cluster's key prefix (default {DEFAULT_PREFIX})")


def _fail(message: str, code: int = Exit.USAGE) -> int:
    print(f"policyc cluster: error: {message}", file=sys.stderr)
    return int(code)


def _store(args):  # type: ignore[no-untyped-def]
    from policyc.cluster.etcd_store import EtcdStore
    from policyc.cluster.keys import Keys

    return EtcdStore(args.etcd, op_timeout=3.0), Keys(args.etcd_prefix)


def _status(args) -> int:  # type: ignore[no-untyped-def]
    from policyc.cluster.status import gather, render
    from policyc.cluster.store import StoreError

    try:
        store, keys = _store(args)
    except ValueError as e:
        return _fail(str(e))

    async def go():  # type: ignore[no-untyped-def]
        await store.connect()
        try:
            return await gather(store, keys)
        finally:
            await store.close()
    try:
        view = asyncio.run(go())
    except StoreError as e:
        return _fail(str(e), Exit.UNAVAILABLE)
    print(json.dumps(view.to_json(), indent=2, default=lambda o: o.__dict__) if args.format == "json" else render(view))
    return 0


def _rollout(args) -> int:  # type: ignore[no-untyped-def]
    from policyc.cluster.bundle_rollout import RolloutError, roll_out
    from policyc.cluster.store import StoreError
    from policyc.compiler import bundle_io

    try:
        from policyc.cli.keys import KeyError_, load_public

        try:
            key = load_public(args.public_key) if args.public_key else None
        except KeyError_ as e:
            return _fail(str(e))
        bundle = bundle_io.load(args.bundle, public_key=key)
        store, keys = _store(args)
    except (bundle_io.BundleError, ValueError) as e:
        return _fail(str(e))

    async def go():  # type: ignore[no-untyped-def]
        await store.connect()
        try:
            return await roll_out(store, keys, bundle, expect=args.expect)
        finally:
            await store.close()
    try:
        out = asyncio.run(go())
    except RolloutError as e:
        print(f"policyc cluster: rollout refused: {e}", file=sys.stderr)
        return int(Exit.FAILED)
    except StoreError as e:
        return _fail(str(e), Exit.UNAVAILABLE)
    print(f"in force: {out.current} (was {out.previous or 'none'}); each replica verifies it, swaps, and reports it "
          "(see `policyc cluster status`)")
    return 0
