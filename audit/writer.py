"""The chain writer: hashes record bodies into the chain and stores them, with the
checkpoints that seal them, one transaction (one fsync) per batch.

It runs in the writer process (`writer_process.py`), so none of this work holds the
decision service's interpreter lock. It trusts the state the opening side checked
(`AuditLog.open` re-hashes the tail before starting it) and advances its head only after
a commit, so a failed batch leaves the chain exactly where it was.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Callable

from .chain import COLUMNS, digest
from .index_columns import IndexRow
from .store import Durability, insert_rows_sql

# One multi-row INSERT per chunk rather than `executemany`: one statement step per batch
# (measured: executemany costs ~1.65x the CPU for 32 rows).
ROWS_PER_INSERT = 32766 // (4 + len(COLUMNS))  # parameters per statement, under SQLite's limit

Signer = Callable[[int, bytes, float, bool], tuple[str | None, str | None]]


@dataclass(frozen=True, slots=True)
class WriterConfig:
    """What the opening side hands the writer: where, how durable, and the checked head."""

    path: str
    durability: Durability
    log_id: str
    seq: int
    head: bytes
    sealed_seq: int
    checkpoint_every: int
    checkpoint_interval: float
    redact: tuple[str, ...]
    signing_key: bytes | None  # raw ed25519 private key, or None for unsigned checkpoints
    indexed: bool = True  # store v2: the writer fills the index columns (v1: SQLite generates them)

    def to_wire(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_wire(cls, d: dict[str, object]) -> WriterConfig:
        return cls(**d)  # type: ignore[arg-type]


class ChainWriter:
    def __init__(self, cfg: WriterConfig, sign: Signer | None) -> None:
        self._conn = sqlite3.connect(cfg.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={'FULL' if cfg.durability == 'full' else 'NORMAL'}")
        self._sign = sign
        self.path = cfg.path
        self.seq, self.head = cfg.seq, cfg.head
        self.indexed = cfg.indexed
        self._every = max(1, cfg.checkpoint_every)
        self._interval = cfg.checkpoint_interval
        self.sealed_seq, self.sealed_time = cfg.sealed_seq, time.monotonic()
        self.commits = 0

    def seal_due_in(self) -> float | None:
        """Seconds until the periodic checkpoint is due (None: nothing to seal)."""
        if self.seq <= self.sealed_seq:
            return None
        return max(0.0, self._interval - (time.monotonic() - self.sealed_time))

    def force_seal(self) -> None:
        self.sealed_time = -float("inf")

    def write(self, records: list[tuple[bytes, IndexRow]], *, final: bool = False) -> None:
        """Chain, insert and commit `records` (body, index columns) plus a checkpoint when
        one is due, in one transaction. Raises sqlite3.Error with nothing changed."""
        seq, prev = self.seq, self.head
        rows: list[tuple[object, ...]] = []
        seals: list[tuple[int, bytes, bool]] = []  # (seq, hash, final)
        sealed = self.sealed_seq
        indexed = self.indexed
        for body, index in records:
            seq += 1
            h = digest(prev, seq, body)
            rows.append((seq, body, prev, h, *index) if indexed else (seq, body, prev, h))
            prev = h
            if seq - sealed >= self._every:
                seals.append((seq, h, False))
                sealed = seq
        now = time.monotonic()
        if seq > 0 and (final or (seq > sealed and now - self.sealed_time >= self._interval)):
            seals.append((seq, prev, final))
            sealed = seq
        if not rows and not seals:
            return
        if seals or len(rows) > ROWS_PER_INSERT:
            self._transaction(rows, seals)
        else:  # one autocommit statement: atomic and durable by itself
            self._conn.execute(insert_rows_sql(len(rows), indexed), [v for row in rows for v in row])
        self.commits += 1
        self.seq, self.head = seq, prev
        if seals:
            self.sealed_seq, self.sealed_time = sealed, now

    def _transaction(self, rows: list[tuple[object, ...]], seals: list[tuple[int, bytes, bool]]) -> None:
        """Entries and the checkpoints that seal them, committed together."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for i in range(0, len(rows), ROWS_PER_INSERT):
                chunk = rows[i : i + ROWS_PER_INSERT]
                conn.execute(insert_rows_sql(len(chunk), self.indexed), [v for row in chunk for v in row])
            if seals:
                wall = time.time()
                conn.executemany(
                    "INSERT INTO checkpoints (seq, hash, time, final, public_key, signature) VALUES (?, ?, ?, ?, ?, ?)",
                    [(s, h, wall, int(f), *(self._sign(s, h, wall, f) if self._sign else (None, None))) for s, h, f in seals],
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._conn.close()
