"""One record proven on its own: `policyc audit verify --record ID`.

An auditor samples a few decisions (from an export, or by id) and wants each proven without
walking the whole log. A record's hash covers its predecessor's hash, its seq and its body;
each later entry's hash covers the one before. So re-hashing the record, then every entry
after it up to a checkpoint the auditor trusts, and arriving at that checkpoint's hash,
proves the record is the one the checkpoint vouched for, byte for byte, at that position.

What the auditor trusts: an anchor kept apart from the log (`--anchor`, at or after the
record), or, with the operator's public key, the first signed checkpoint in the log at or
after the record (its signature checked). A record from an export (`--sample FILE`) is
proven the same way: its own `prev_hash`, `seq` and `body` must give its `hash`, and the
log's entries after it must lead from that hash to the anchor; a sample edited after export
or a log edited after the anchor is refused, naming why.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .chain import digest
from .checkpoints import Checkpoint, signature_valid
from .errors import AuditInputError
from .segments import closed_segments
from .store import connect_reader, log_id


@dataclass(frozen=True, slots=True)
class RecordProof:
    seq: int
    hash: str
    anchor_seq: int
    anchor_kind: str  # "anchor" | "signed checkpoint"
    walked: int  # entries re-hashed after the record
    ok: bool
    message: str


def _files(log: Path) -> list[Path]:
    out = [p for _, p in closed_segments(log)]
    if log.is_file():
        out.append(log)
    if not out:
        connect_reader(log)
    return out


def _locate(files: list[Path], record_id: str) -> tuple[int, tuple[Any, ...]]:
    """(seq, row) of the record named `seq:N`, `N`, or a decision id."""
    key = record_id.removeprefix("seq:")
    for f in files:
        conn = connect_reader(f)
        try:
            if key.isascii() and key.isdigit():
                row = conn.execute("SELECT seq, body, prev_hash, hash FROM entries WHERE seq = ?", (int(key),)).fetchone()
            else:
                row = conn.execute("SELECT seq, body, prev_hash, hash FROM entries WHERE decision_id = ? AND kind = 'decision' "
                                   "ORDER BY seq LIMIT 1", (record_id,)).fetchone()
        finally:
            conn.close()
        if row is not None:
            return int(row[0]), row
    raise AuditInputError(f"record `{record_id}` is not in the log (nor in any kept segment)")


def _after(files: list[Path], lo: int, hi: int) -> Iterator[tuple[int, bytes, bytes, bytes]]:
    """Entries lo..hi in seq order, across segments."""
    for f in files:
        conn = connect_reader(f)
        try:
            for seq, body, prev, h in conn.execute("SELECT seq, body, prev_hash, hash FROM entries WHERE seq BETWEEN ? AND ? ORDER BY seq",
                                                   (lo, hi)):
                yield seq, bytes(body), bytes(prev), bytes(h)
        finally:
            conn.close()


def _signed_checkpoint(files: list[Path], seq: int, key: Ed25519PublicKey) -> Checkpoint | None:
    """The first checkpoint at or after `seq` whose signature `key` verifies."""
    from .verify import _load_checkpoints

    for f in files:
        conn = connect_reader(f)
        try:
            lid = log_id(conn)
            cps, _ = _load_checkpoints(conn)
        finally:
            conn.close()
        for cp in sorted((c for c in cps if c.seq >= seq), key=lambda c: c.seq):
            if signature_valid(key, lid, cp):
                return cp
    return None


def prove_record(log: str | os.PathLike[str], record_id: str, *, anchor: Checkpoint | None = None,
                 public_key: Ed25519PublicKey | None = None, sample: dict[str, Any] | None = None) -> RecordProof:
    """Prove the record `record_id` (or the exported row `sample`) against `anchor`, or
    against the first checkpoint after it that `public_key` verifies. Raises
    AuditInputError when there is nothing to prove against or the record is absent."""
    files = _files(Path(log))
    if sample is not None:
        try:
            seq, body, prev, h = int(sample["seq"]), str(sample["body"]).encode(), bytes.fromhex(sample["prev_hash"]), bytes.fromhex(sample["hash"])
        except (KeyError, TypeError, ValueError):
            raise AuditInputError("the sampled row lacks its chain position (seq, prev_hash, hash, body): export it again") from None
    else:
        seq, row = _locate(files, record_id)
        body, prev, h = bytes(row[1]), bytes(row[2]), bytes(row[3])
    if public_key is not None and anchor is not None and anchor.signature is not None:
        conn = connect_reader(files[-1])
        try:
            lid = log_id(conn)
        finally:
            conn.close()
        if not signature_valid(public_key, lid, anchor):
            return RecordProof(seq, h.hex(), anchor.seq, "anchor", 0, False, "the anchor is not signed by the given public key")
    kind = "anchor"
    if anchor is None or anchor.seq < seq:
        if public_key is None:
            if anchor is not None:
                raise AuditInputError(f"the anchor (entry {anchor.seq}) is older than record {seq}: prove it against a later anchor, "
                                      "or give the operator's public key to use the log's signed checkpoint after it")
            raise AuditInputError("proving a record needs an anchor kept apart from the log (--anchor) or the operator's public key (--public-key)")
        anchor = _signed_checkpoint(files, seq, public_key)
        kind = "signed checkpoint"
        if anchor is None:
            return RecordProof(seq, h.hex(), 0, kind, 0, False, f"no checkpoint at or after entry {seq} carries a valid signature "
                                                                 "by the given key: the record is not sealed yet, or its seals were forged")
    if digest(prev, seq, body) != h:
        return RecordProof(seq, h.hex(), anchor.seq, kind, 0, False,
                           f"record {seq}: its content does not match its hash: it was altered after it was written")
    cur, walked = h, 0
    try:
        for s, b, p, hh in _after(files, seq + 1, anchor.seq):
            if s != seq + 1 + walked or p != cur or digest(p, s, b) != hh:
                return RecordProof(seq, h.hex(), anchor.seq, kind, walked, False,
                                   f"the chain from record {seq} breaks at entry {s}: the log after the record was altered, or the record "
                                   "is not the one the log holds at this position")
            cur, walked = hh, walked + 1
    except sqlite3.DatabaseError as e:
        raise AuditInputError(f"the log cannot be read after entry {seq} ({e}); run `policyc audit verify`") from None
    if seq + walked != anchor.seq or cur.hex() != anchor.hash:
        why = (f"entries {seq + walked + 1}..{anchor.seq} are missing" if seq + walked != anchor.seq
               else f"the chain from record {seq} does not arrive at the {kind}'s hash at entry {anchor.seq}")
        return RecordProof(seq, h.hex(), anchor.seq, kind, walked, False, why + ": the record or the log was altered")
    return RecordProof(seq, h.hex(), anchor.seq, kind, walked, True,
                       f"record {seq} is proven: re-hashed with the {walked} entries after it, the chain arrives at the {kind} at entry {anchor.seq}")

