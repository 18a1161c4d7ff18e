"""Audit across replicas: each replica keeps its own hash-chained log, and anchors its
latest signed checkpoint (seq, entry hash) in the store under the log's id. The anchors
outlive the replicas (no lease), so an auditor verifying every replica's log with
`policyc audit verify --log A --log B --etcd URL` can tell a log that was cut (it ends
before its anchor) or rewritten (its entry at the anchored seq hashes differently), and a
replica whose log was not handed over at all."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from policyc.audit.checkpoints import Checkpoint
from policyc.audit.errors import AuditError
from policyc.audit.store import connect_reader, log_id

from .keys import Keys
from .store import FleetStore


@dataclass(frozen=True, slots=True)
class Anchor:
    log_id: str
    replica: str
    checkpoint: Checkpoint

    def encode(self) -> bytes:
        return json.dumps({"log_id": self.log_id, "replica": self.replica,
                           "checkpoint": self.checkpoint.model_dump(mode="json")}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Anchor":
        b = json.loads(raw)
        return cls(str(b["log_id"]), str(b["replica"]), Checkpoint.model_validate(b["checkpoint"]))


def latest_checkpoint(path: Path) -> tuple[str, Checkpoint | None]:
    """The log's id and its latest checkpoint's seq and hash (what an anchor needs),
    read-only (the writer keeps writing)."""
    conn = connect_reader(path)
    try:
        lid = log_id(conn)
        row = conn.execute("SELECT id, seq, hash, time, final FROM checkpoints ORDER BY id DESC LIMIT 1").fetchone()
    except sqlite3.Error as e:
        raise AuditError(f"{path}: cannot read checkpoints: {e}") from None
    finally:
        conn.close()
    if row is None:
        return lid, None
    id_, seq, h, t, final = row
    return lid, Checkpoint(id=id_, seq=seq, hash=h.hex() if isinstance(h, bytes) else str(h), time=t, final=bool(final))


def log_id_of(path: str | Path) -> str:
    conn = connect_reader(path)
    try:
        return log_id(conn)
    finally:
        conn.close()


async def anchor(store: FleetStore, keys: Keys, replica: str, path: Path, last_seq: int) -> int:
    """Anchor the log's latest checkpoint if it is past `last_seq`; returns the seq anchored."""
    lid, cp = await asyncio.to_thread(latest_checkpoint, path)
    if cp is None or cp.seq <= last_seq:
        return last_seq
    await store.put(keys.anchor(lid), Anchor(lid, replica, cp).encode())
    return cp.seq


async def read_anchors(store: FleetStore, keys: Keys) -> dict[str, Anchor]:
    snap = await store.read_prefix(keys.anchors)
    out = {}
    for e in snap.entries:
        try:
            a = Anchor.decode(e.value)
        except (ValueError, KeyError, TypeError):
            continue
        out[a.log_id] = a
    return out


def fetch_anchors(endpoints: list[str], prefix: str) -> dict[str, Anchor]:
    """Every anchored log of the cluster at `endpoints` (for `policyc audit verify --etcd`)."""
    from .etcd_store import EtcdStore

    async def go() -> dict[str, Anchor]:
        store = EtcdStore(endpoints, op_timeout=3.0)
        await store.connect()
        try:
            return await read_anchors(store, Keys(prefix))
        finally:
            await store.close()
    return asyncio.run(go())
