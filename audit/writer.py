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

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .chain import COLUMNS, digest
from .index_columns import IndexRow
from .segments import segment_path
from .store import Durability, create_segment, fsync_dir, insert_rows_sql, segment_base

# One multi-row INSERT per chunk rather than `executemany`: one statement step per batch
# (measured: executemany costs ~1.65x the CPU for 32 rows).
ROWS_PER_INSERT = 32766 // (4 + len(COLUMNS))  # parameters per statement, under SQLite's limit

Signer = Callable[[int, bytes, float, bool, bool, bytes], tuple[str | None, str | None]]  # seq, hash, time, final, opens, sealed
HeadSink = Callable[[int, int, bytes, float, bool, bool], None]  # segment, seq, hash, time, final, opens: the sealed head (`head.py`)


class RotateError(Exception):
    """The live segment could not be closed and replaced (nothing to close, readers in the way)."""


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
    def __init__(self, cfg: WriterConfig, sign: Signer | None, head: HeadSink | None = None) -> None:
        self._cfg = cfg
        self._conn = self._connect()
        self._sign = sign
        self._head = head
        self.segment, self.base_seq, _ = segment_base(self._conn)
        self.path = cfg.path
        self.seq, self.head = cfg.seq, cfg.head
        self.indexed = cfg.indexed
        self._every = max(1, cfg.checkpoint_every)
        self._interval = cfg.checkpoint_interval
        self.sealed_seq, self.sealed_time = cfg.sealed_seq, time.monotonic()
        self.commits = 0
        # hashes of the entries after the last checkpoint (which the next one keeps, `sealed`)
        self._since: list[bytes] = [r[0] for r in self._conn.execute("SELECT hash FROM entries WHERE seq > ? ORDER BY seq", (cfg.sealed_seq,))]

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._cfg.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self._cfg.durability == 'full' else 'NORMAL'}")
        conn.execute("PRAGMA busy_timeout=5000")  # a reader's snapshot in the way of a rotation's checkpoint of the WAL
        return conn

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
        wall = 0.0
        try:
            if seals or n > ROWS_PER_INSERT:
                wall = self._transaction(params, n, seals)
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
            if self._head is not None:  # after the commit: a head never names a checkpoint the log lacks
                s, h, f, o, _ = seals[-1]
                self._head(self.segment, s, h, wall, f, o)

    def _transaction(self, params: list[object], n: int, seals: list[tuple[int, bytes, bool, bool, bytes]]) -> float:
        """Entries (`n` rows of `params`) and the checkpoints that seal them, committed
        together; returns the checkpoints' time."""
        conn = self._conn
        width = len(params) // n if n else 0
        wall = time.time()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for i in range(0, n, ROWS_PER_INSERT):
                rows = min(ROWS_PER_INSERT, n - i)
                conn.execute(insert_rows_sql(rows, self.indexed), params[i * width : (i + rows) * width])
            if seals:
                conn.executemany(
                    "INSERT INTO checkpoints (seq, hash, time, final, public_key, signature, opens, sealed) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(s, h, wall, int(f), *(self._sign(s, h, wall, f, o, b) if self._sign else (None, None)), int(o), b)
                     for s, h, f, o, b in seals],
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return wall

    def rotate(self) -> int:
        """Close the live segment with a signed close record, move it to the segments
        directory and start a new live segment chained to it, sealed by a signed opening at
        the entry it follows. Returns the closed segment's number. Raises RotateError with
        nothing changed when there is nothing to close or the WAL cannot be emptied (a
        reader's snapshot held it for 5 s); sqlite3.Error / OSError past the move leave the
        live file absent, which `AuditLog.open` completes (`segments.py`)."""
        if self.seq <= self.base_seq:
            raise RotateError(f"{self.path}: the live segment has no entry to close")
        self.write([], final=True)
        busy = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if busy:  # moving the file now would leave committed pages behind in the WAL: stay, and reopen after the close record
            self.write([], opens=True)
            raise RotateError(f"{self.path}: a reader kept the write-ahead log busy for 5 s; the segment was not rotated (try again)")
        lid = self._cfg.log_id
        durable = self._cfg.durability == "full"
        self._conn.close()
        live = Path(self.path)
        dest = segment_path(live, self.segment)
        dest.parent.mkdir(exist_ok=True)
        if dest.exists():
            raise RotateError(f"{dest}: a closed segment of that number already exists")
        os.replace(live, dest)
        for side in ("-wal", "-shm"):  # emptied by the checkpoint above; a new live file must not pick them up
            Path(f"{live}{side}").unlink(missing_ok=True)
        if durable:
            fsync_dir(dest.parent)
        closed = self.segment
        create_segment(live, lid, closed + 1, self.seq, self.head, durable=durable)
        self._conn = self._connect()
        self.segment, self.base_seq = closed + 1, self.seq
        self.sealed_seq = self.seq
        self._since = []
        self.write([], opens=True)
        return closed

    def close(self) -> None:
        self._conn.close()
