"""The chain writer: hashes record bodies into the chain and stores them, with the
checkpoints that seal them, one transaction (one fsync) per batch.

A checkpoint is written at every multiple of `checkpoint_every` entries (whatever the other
checkpoints between, so a log's checkpoint positions do not depend on batch timing), every
`checkpoint_interval` seconds while entries arrive, when a writer opens a log that has entries, at close, and with
a new log's first batch (so no log is ever without one once it holds an entry).

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

Signer = Callable[[int, bytes, float, bool, bool, bytes], tuple[str | None, str | None]]  # seq, hash, time, final, opens, sealed


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
    warm: bool = False  # load the draft encoder before READY (a decision service's first drafts are not delayed)

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
        # hashes of the entries after the last checkpoint (which the next one keeps, `sealed`)
        self._since: list[bytes] = [r[0] for r in self._conn.execute("SELECT hash FROM entries WHERE seq > ? ORDER BY seq", (cfg.sealed_seq,))]

    def seal_due_in(self) -> float | None:
        """Seconds until the periodic checkpoint is due (None: nothing to seal)."""
        if self.seq <= self.sealed_seq:
            return None
        return max(0.0, self._interval - (time.monotonic() - self.sealed_time))

    def force_seal(self) -> None:
        self.sealed_time = -float("inf")

    def write(self, records: list[tuple[bytes, IndexRow]], *, final: bool = False, opens: bool = False) -> None:
        """Chain, insert and commit `records` (body, index columns) plus a checkpoint when
        one is due, in one transaction. Raises sqlite3.Error with nothing changed.
        `final`: seal with the close record; `opens`: seal the head as found (a writer's first act)."""
        seq, prev = self.seq, self.head
        params: list[object] = []  # the rows' values, row after row (what the INSERT binds: no tuple per row)
        add = params.extend
        seals: list[tuple[int, bytes, bool, bool, bytes]] = []  # (seq, hash, final, opens, sealed hashes)
        sealed = self.sealed_seq
        indexed = self.indexed
        since = self._since
        kept = len(since)
        cut = 0  # hashes of `since` that this batch's seals take
        for body, index in records:
            seq += 1
            h = digest(prev, seq, body)
            add((seq, body, prev, h))
            if indexed:
                add(index)
            since.append(h)
            prev = h
            if seq % self._every == 0:  # at most `every` entries since the last checkpoint, at fixed positions
                end = cut + seq - sealed
                seals.append((seq, h, False, False, b"".join(since[cut:end])))
                sealed, cut = seq, end
        now = time.monotonic()
        # a log with no checkpoint yet is sealed with its first batch: until then nothing could
        # show that it ever held an entry (a fresh log emptied or replaced would verify clean)
        first = sealed == 0
        if seq > 0 and (final or opens or first or (seq > sealed and now - self.sealed_time >= self._interval)):
            end = cut + seq - sealed
            seals.append((seq, prev, final, opens, b"".join(since[cut:end])))
            sealed, cut = seq, end
        n = seq - self.seq
        if not n and not seals:
            return
        try:
            if seals or n > ROWS_PER_INSERT:
                self._transaction(params, n, seals)
            else:  # one autocommit statement: atomic and durable by itself
                self._conn.execute(insert_rows_sql(n, indexed), params)
        except BaseException:
            del since[kept:]
            raise
        del since[:cut]
        self.commits += 1
        self.seq, self.head = seq, prev
        if seals:
            self.sealed_seq, self.sealed_time = sealed, now

    def _transaction(self, params: list[object], n: int, seals: list[tuple[int, bytes, bool, bool, bytes]]) -> None:
        """Entries (`n` rows of `params`) and the checkpoints that seal them, committed together."""
        conn = self._conn
        width = len(params) // n if n else 0
        conn.execute("BEGIN IMMEDIATE")
        try:
            for i in range(0, n, ROWS_PER_INSERT):
                rows = min(ROWS_PER_INSERT, n - i)
                conn.execute(insert_rows_sql(rows, self.indexed), params[i * width : (i + rows) * width])
            if seals:
                wall = time.time()
                conn.executemany(
                    "INSERT INTO checkpoints (seq, hash, time, final, public_key, signature, opens, sealed) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(s, h, wall, int(f), *(self._sign(s, h, wall, f, o, b) if self._sign else (None, None)), int(o), b)
                     for s, h, f, o, b in seals],
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._conn.close()
