"""Bundles rolled out by hash.

A bundle is stored under its own content hash (`bundles/<hash>`, its canonical JSON); one
key (`bundle`) names the hash in force and changes only by compare-and-swap, so two
operators rolling out at once cannot both win, and a rollout names what it replaces.
Each replica, seeing the pointer move, reads the bytes, verifies them with the same
loader as start-up (`bundle_io.loads`: schema, content hash, and the ed25519 signature
when the replica was given a public key), checks the hash is the one named, and only
then swaps; then it publishes the hash it runs in its report. A bundle that fails any of
this is refused and the old one keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle

from .keys import Keys
from .store import FleetStore, Guard, Put


class RolloutError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Rollout:
    previous: str  # "" when none was in force
    current: str


async def in_force(store: FleetStore, keys: Keys) -> str:
    e = await store.get(keys.bundle)
    return e.value.decode() if e is not None else ""


async def publish(store: FleetStore, keys: Keys, bundle: Bundle) -> str:
    """Store the bundle under its hash (idempotent); returns the hash."""
    h = bundle.content_hash
    await store.put(keys.bundle_blob(h), bundle_io.dumps(bundle).encode())
    return h


async def roll_out(store: FleetStore, keys: Keys, bundle: Bundle, *, expect: str | None = None) -> Rollout:
    """Publish `bundle` and make it the one in force, if the one in force is `expect`
    (default: whatever is in force now, read first). RolloutError when another rollout
    won the race."""
    h = await publish(store, keys, bundle)
    prev = await in_force(store, keys) if expect is None else expect
    guard = Guard(keys.bundle, create_revision=0) if not prev else Guard(keys.bundle, value=prev.encode())
    ok, _ = await store.transact([guard], [Put(keys.bundle, h.encode())])
    if not ok:
        now = await in_force(store, keys)
        raise RolloutError(f"the bundle in force is {now[:23] or 'none'}…, not {prev[:23] or 'none'}…: another rollout "
                           "changed it; nothing was swapped")
    return Rollout(prev, h)


def verify_blob(key: str, raw: bytes | None, want_hash: str, load_text: Callable[[bytes, str], Bundle]) -> Bundle:
    """The bundle at `key`, verified by the server's own verifier (`load_text`: the one
    start-up, ReloadBundle and SIGHUP use), and checked to be the one the pointer names.
    BundleError says what is wrong."""
    if raw is None:
        raise bundle_io.BundleError(f"{key}: the bundle in force names {want_hash[:23]}…, which the store does not hold")
    bundle = load_text(raw, key)
    if bundle.content_hash != want_hash:
        raise bundle_io.BundleError(f"{key}: the bundle's content hash is {bundle.content_hash[:23]}…, not the "
                                    f"{want_hash[:23]}… it is stored under")
    return bundle
