"""The audit log writer: hash-chained, group-committed, acknowledged only when durable.

Callers (decision threads, the enforcer's guardian) hand over records; a single writer
thread takes everything queued so far, chains and inserts it in one transaction and
commits it (fsync), then releases every caller of that batch at once. Each decision thus
waits for *a* commit, not for its own: under load a batch holds many records and the fsync
cost is shared (group commit). `append_*` returns the record's sequence number only after
the batch is durable; `submit_*` returns a receipt to wait on later.

Opening a log that a crash left behind inspects the write-ahead log first (`wal.py`),
lets SQLite discard a torn or unfinished tail, checks the chain since the last checkpoint,
and records the repair as an action in the log itself.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import IO, Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from . import checkpoints
from .chain import digest, genesis
from .errors import AuditError, AuditLogCorrupt, AuditLogUnavailable, AuditWriteError
from .records import ActionRecord, DecisionRecord
from .consistency import first_inconsistent
from .redaction import DEFAULT_REDACT, Redactor
from .store import CHAIN_SELECT, Durability, connect_writer, entries_definition_intact, insert_rows_sql, log_id
from .verify_chain import walk
from .wal import WalTail, inspect_wal

_Item = bytes  # the record's JSON, redacted
# One multi-row INSERT per batch rather than `executemany`: sqlite3 releases the GIL around
# every step, and under load from decision threads each re-acquisition can wait a whole
# switch interval, so one step per batch instead of one per row keeps the writer's
# latency independent of how busy the interpreter is.
_ROWS_PER_INSERT = 8000  # 4 parameters per row, under SQLite's 32766


class _Batch:
    """Records queued together; they become durable (or fail) together."""

    __slots__ = ("items", "done", "first_seq", "error")

    def __init__(self) -> None:
        self.items: list[_Item] = []
        self.done = threading.Event()
        self.first_seq = 0
        self.error: BaseException | None = None


class Receipt:
    """A queued record; `wait()` returns its sequence number once it is durable."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch, self._index = batch, index

    def wait(self, timeout: float | None = None) -> int:
        if not self._batch.done.wait(timeout):
            raise AuditWriteError(f"audit record not durable after {timeout} s")
        if self._batch.error is not None:
            raise AuditWriteError(f"audit record was not stored: {self._batch.error}") from self._batch.error
        return self._batch.first_seq + self._index


class AuditLog:
    """The append side of an audit log. Open with `AuditLog.open(path, ...)`."""

    def __init__(
        self,
        path: Path,
        lock: IO[str],
        *,
        signing_key: Ed25519PrivateKey | None,
        redact: Iterable[str],
        checkpoint_every: int,
        checkpoint_interval: float,
        durability: Durability,
        max_pending: int,
    ) -> None:
        self.path = path
        self._lock_file = lock
        self._key = signing_key
        self._redactor = Redactor(redact)
        self._every = max(1, checkpoint_every)
        self._interval = checkpoint_interval
        self._max_pending = max_pending
        self.recovery: WalTail = inspect_wal(path)
        self._conn = connect_writer(path, durability)
        try:
            if self.recovery.torn or Path(f"{path}-wal").exists():
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._log_id = log_id(self._conn)
            self._seq, self._head = self._check_tail()
        except BaseException:
            self._conn.close()
            raise
        row = self._conn.execute("SELECT seq, time FROM checkpoints ORDER BY id DESC LIMIT 1").fetchone()
        self._sealed_seq, self._sealed_time = (row[0], time.monotonic()) if row else (0, time.monotonic())
        self._cond = threading.Condition()
        self._pending = _Batch()
        self._closing = False
        self._closed = False
        self.commits = 0  # transactions committed by this writer (group commit: < records)
        self._writer = threading.Thread(target=self._run, name=f"audit-writer:{path.name}", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        signing_key: Ed25519PrivateKey | str | os.PathLike[str] | None = None,
        redact: Iterable[str] = DEFAULT_REDACT,
        checkpoint_every: int = 10_000,
        checkpoint_interval: float = 60.0,
        durability: Durability = "full",
        max_pending: int = 65_536,
    ) -> AuditLog:
        """Open (or create) the log at `path` for appending.

        `signing_key`: an ed25519 private key (or a path to one) that signs checkpoints;
        None writes unsigned checkpoints. `redact`: header names never stored.
        `durability="full"` survives power loss; "normal" survives a killed process only.
        Raises AuditLogUnavailable (another writer holds it, not an audit log, ...) or
        AuditLogCorrupt (the chain's tail was altered: run `policyc audit verify`)."""
        p = Path(path)
        if not p.parent.is_dir():
            raise AuditLogUnavailable(f"{p}: directory `{p.parent}` does not exist")
        key = signing_key if signing_key is None or isinstance(signing_key, Ed25519PrivateKey) else checkpoints.load_private_key(signing_key)
        lock = open(f"{p}.lock", "a")  # noqa: SIM115 (held for the log's lifetime)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise AuditLogUnavailable(f"{p}: audit log is already open for writing by another process") from None
        try:
            log = cls(
                p,
                lock,
                signing_key=key,
                redact=redact,
                checkpoint_every=checkpoint_every,
                checkpoint_interval=checkpoint_interval,
                durability=durability,
                max_pending=max_pending,
            )
        except BaseException:
            lock.close()
            raise
        if log.recovery.torn:
            log.append_action(
                ActionRecord(
                    time=time.time(),
                    kind="log_recovered",
                    target=str(p),
                    outcome="done",
                    dry_run=False,
                    detail=f"{log.recovery.reason}: discarded {log.recovery.torn_bytes} bytes "
                    f"({log.recovery.uncommitted_frames} unacknowledged frame(s)) after the last commit",
                )
            )
        return log

    def _check_tail(self) -> tuple[int, bytes]:
        """Re-hash the entries since the last checkpoint (at most `checkpoint_every` + a
        margin); a mismatch means the tail was altered and appending would bury it."""
        head = self._conn.execute("SELECT max(seq) FROM entries").fetchone()[0]
        if head is None:
            return 0, genesis(self._log_id)
        cp = self._conn.execute("SELECT seq, hash FROM checkpoints WHERE seq <= ? ORDER BY seq DESC LIMIT 1", (head,)).fetchone()
        if cp is not None:
            stored = self._conn.execute("SELECT hash FROM entries WHERE seq = ?", (cp[0],)).fetchone()
            if stored is None or stored[0] != cp[1]:
                raise AuditLogCorrupt(
                    f"{self.path}: entry {cp[0]} no longer has the hash its last checkpoint sealed; refusing to append. "
                    f"Run `policyc audit verify {self.path}`"
                )
        start = max(cp[0] if cp else 0, head - 2 * self._every)
        if start == 0:
            prev = genesis(self._log_id)
        else:
            row = self._conn.execute("SELECT hash FROM entries WHERE seq = ?", (start,)).fetchone()
            if row is None:
                raise AuditLogCorrupt(f"{self.path}: entry {start} is missing; run `policyc audit verify {self.path}`")
            prev = row[0]
        rows = self._conn.execute(CHAIN_SELECT + " WHERE seq > ? ORDER BY seq", (start,))
        result = walk(rows, prev, start + 1)
        if result.problem is None and not entries_definition_intact(self._conn):
            bad = first_inconsistent(self._conn, 1, result.last_seq) or (result.last_seq, "table definition")
            if bad is not None:
                raise AuditLogCorrupt(
                    f"{self.path}: the chain's tail does not verify at seq {bad[0]} (index column `{bad[1]}` disagrees with the record); "
                    f"refusing to append. Run `policyc audit verify {self.path}`"
                )
        if result.problem is not None:
            raise AuditLogCorrupt(
                f"{self.path}: the chain's tail does not verify at seq {result.problem.seq} ({result.problem.message}); "
                f"refusing to append. Run `policyc audit verify {self.path}`"
            )
        return result.last_seq, result.last_hash

    # ------------------------------------------------------------------ appending

    def submit_decision(self, record: DecisionRecord) -> Receipt:
        """Queue a decision record (redacted here); wait on the receipt for durability."""
        if not isinstance(record, DecisionRecord):
            raise TypeError(f"submit_decision takes a DecisionRecord, not {type(record).__name__}")
        return self._enqueue(self._redactor.dump(record, record.request).encode())

    def submit_action(self, record: ActionRecord) -> Receipt:
        if not isinstance(record, ActionRecord):
            raise TypeError(f"submit_action takes an ActionRecord, not {type(record).__name__}")
        return self._enqueue(record.model_dump_json(exclude_none=True).encode())

    def append_decision(self, record: DecisionRecord) -> int:
        """Store a decision record; returns its seq once durable (that is the acknowledgement)."""
        return self.submit_decision(record).wait()

    def append_action(self, record: ActionRecord) -> int:
        """Store an enforcement / self-heal action; usable directly as the guardian's sink."""
        return self.submit_action(record).wait()

    def _enqueue(self, item: _Item) -> Receipt:
        with self._cond:
            if self._closing:
                raise AuditWriteError(f"{self.path}: audit log is closed")
            while len(self._pending.items) >= self._max_pending:
                self._cond.wait()
            batch = self._pending
            batch.items.append(item)
            if len(batch.items) == 1:
                self._cond.notify_all()
            return Receipt(batch, len(batch.items) - 1)

    # ------------------------------------------------------------------ the writer

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending.items and not self._closing:
                    wait = self._interval - (time.monotonic() - self._sealed_time)
                    if self._seq > self._sealed_seq and wait <= 0:
                        break
                    self._cond.wait(timeout=max(wait, 0.05) if self._seq > self._sealed_seq else None)
                batch, self._pending = self._pending, _Batch()
                closing = self._closing
                self._cond.notify_all()
            try:
                batch.first_seq = self._write(batch.items, final=closing and not batch.items)
            except BaseException as e:  # noqa: BLE001 (reported to every waiting caller)
                batch.error = e
            batch.done.set()
            if closing and not batch.items:
                return

    def _write(self, items: list[_Item], *, final: bool) -> int:
        """Chain, insert and commit `items` (plus a checkpoint when one is due) in one
        transaction; returns the first seq. The head advances only after the commit."""
        seq, prev = self._seq, self._head
        rows: list[tuple[int, bytes, bytes, bytes]] = []
        seals: list[tuple[int, bytes, bool]] = []  # (seq, hash, final)
        sealed = self._sealed_seq
        for body in items:
            seq += 1
            h = digest(prev, seq, body)
            rows.append((seq, body, prev, h))
            prev = h
            if seq - sealed >= self._every:
                seals.append((seq, h, False))
                sealed = seq
        now = time.monotonic()
        if seq > 0 and (final or (seq > sealed and now - self._sealed_time >= self._interval)):
            seals.append((seq, prev, final))
            sealed = seq
        if not rows and not seals:
            return seq + 1
        conn = self._conn
        params = [v for row in rows for v in row]
        if seals or len(rows) > _ROWS_PER_INSERT:
            self._write_transaction(rows, seals)
        else:
            # One autocommit statement: atomic and durable by itself, and a single release
            # of the GIL (see _ROWS_PER_INSERT) for the whole batch.
            conn.execute(insert_rows_sql(len(rows)), params)
        self.commits += 1
        first = self._seq + 1
        self._seq, self._head = seq, prev
        if seals:
            self._sealed_seq, self._sealed_time = sealed, now
        return first

    def _write_transaction(self, rows: list[tuple[int, bytes, bytes, bytes]], seals: list[tuple[int, bytes, bool]]) -> None:
        """Entries and the checkpoints that seal them, committed together."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for i in range(0, len(rows), _ROWS_PER_INSERT):
                chunk = rows[i : i + _ROWS_PER_INSERT]
                conn.execute(insert_rows_sql(len(chunk)), [v for row in chunk for v in row])
            if seals:
                wall = time.time()
                conn.executemany(
                    "INSERT INTO checkpoints (seq, hash, time, final, public_key, signature) VALUES (?, ?, ?, ?, ?, ?)",
                    [(s, h, wall, int(f), *self._sign(s, h, wall, f)) for s, h, f in seals],
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _sign(self, seq: int, h: bytes, wall: float, final: bool) -> tuple[str | None, str | None]:
        if self._key is None:
            return None, None
        return checkpoints.sign(self._key, self._log_id, seq, h.hex(), wall, final)

    # ------------------------------------------------------------------ closing

    def checkpoint(self) -> None:
        """Seal the chain now (as the periodic checkpoint would)."""
        with self._cond:
            self._sealed_time = -float("inf")
            self._cond.notify_all()

    @property
    def last_seq(self) -> int:
        return self._seq

    def close(self) -> None:
        """Flush what is queued, write a final checkpoint, release the log."""
        if self._closed:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._writer.join()
        self._closed = True
        try:
            self._conn.close()
        finally:
            self._lock_file.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AuditLog", "Receipt", "AuditError"]
