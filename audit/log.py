"""The audit log's append side: hash-chained, group-committed, acknowledged only when durable.

Callers (decision threads, the enforcer's guardian) hand over records; a separate writer
*process* (`writer_process.py`) chains, inserts and commits (fsync) everything that arrived
while its previous commit was running, then acknowledges the batch. On the caller's thread a
record costs its serialisation (or, for a `submit_decision_draft`, a MessagePack of plain
values) and one write to a pipe: hashing, SQLite and fsync never hold this interpreter's
lock, so the decision threads keep it. `append_*` returns the record's sequence number only
after its batch is durable; `submit_*` returns a receipt to wait on later.

Opening a log that a crash left behind inspects the write-ahead log first (`wal.py`),
lets SQLite discard a torn or unfinished tail, checks the chain since the last checkpoint,
and records the repair as an action in the log itself. All of that runs here, before the
writer starts, so open() raises the problems it finds.
"""

from __future__ import annotations

import atexit
import bisect
import fcntl
import json
import logging
import os
import queue
import sqlite3
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Callable, Iterable, Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from . import checkpoints
from .chain import genesis
from .consistency import first_inconsistent
from .drafts import DecisionDraft
from .errors import AuditError, AuditLogCorrupt, AuditLogUnavailable, AuditWriteError
from .draft_encoder import DecisionWire, wire_draft, wire_drafts
from .frames import COUNT, Ack, FromWriter, ToWriter, dumps, frame, split, write_all
from .head import HeadUnreadable, read_head
from .records import ActionRecord, DecisionRecord
from .redaction import DEFAULT_REDACT, Redactor
from .segments import closed_segments
from .store import (CHAIN_SELECT, INDEXED_CHAIN_SELECT, STORE_V1, Durability, connect_reader, connect_writer, create_segment,
                    entries_columns_missing, entries_definition_intact, log_id, segment_base, store_schema)
from .verify_chain import walk
from .wal import WalTail, inspect_wal
from .writer import WriterConfig

_log = logging.getLogger("policyc.audit")
_PIPE_BYTES = 1 << 20  # records in flight before a submit blocks (back-pressure)
_F_SETPIPE_SZ = 1031
_OPEN: weakref.WeakSet[AuditLog] = weakref.WeakSet()
_READY_TIMEOUT = 60.0  # seconds for the writer process to start, open the log and seal its opening


@atexit.register
def _close_open_logs() -> None:
    """An interpreter exiting with a log open flushes it (its writer would otherwise drop
    what was submitted but not yet committed, as after a crash)."""
    for log in list(_OPEN):
        try:
            log.close()
        except AuditError as e:
            _log.error("%s", e)


class Receipt:
    """A queued record; `wait()` returns its sequence number once it is durable."""

    __slots__ = ("_log", "_ticket")

    def __init__(self, log: AuditLog, ticket: int) -> None:
        self._log, self._ticket = log, ticket

    def wait(self, timeout: float | None = None) -> int:
        return self._log._settle(self._ticket, timeout)


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
        warm: bool = False,
    ) -> None:
        self.path = path
        self._lock_file = lock
        self._redactor = Redactor(redact)
        self._every = max(1, checkpoint_every)
        self.recovery: WalTail = inspect_wal(path)
        try:
            self._conn = connect_writer(path, durability)
        except sqlite3.DatabaseError as e:
            raise AuditLogCorrupt(f"{path}: the audit log file is damaged (SQLite: {e}); run `policyc audit verify --log {path}`") from None
        try:
            if self.recovery.torn or Path(f"{path}-wal").exists():
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._log_id = log_id(self._conn)
            self._v1 = store_schema(self._conn) == STORE_V1
            self._segment, self._base, base_hash = segment_base(self._conn)
            self._base_hash = base_hash if base_hash is not None else genesis(self._log_id)
            seq, head = self._check_tail()
            self._check_head(seq)
            row = self._conn.execute("SELECT seq FROM checkpoints ORDER BY id DESC LIMIT 1").fetchone()
        except sqlite3.DatabaseError as e:  # a zeroed or missing page: never append to it
            raise AuditLogCorrupt(f"{path}: the audit log file is damaged (SQLite: {e}); refusing to append. "
                                  f"Run `policyc audit verify --log {path}`") from None
        finally:
            self._conn.close()  # the writer process opens its own connection
        key = signing_key.private_bytes_raw() if signing_key is not None else None
        cfg = WriterConfig(str(path), durability, self._log_id, seq, head, row[0] if row else self._base,
                           self._every, checkpoint_interval, tuple(sorted(self._redactor.names)), key, indexed=not self._v1, warm=warm)
        # Settled tickets: seq(t) = t + delta of the last segment starting at or before t;
        # segments change only when a record fails (its seq goes to the next one).
        self._seg_start: list[int] = [0]
        self._seg_delta: list[int] = [seq + 1]
        self._failed: list[tuple[int, int, str]] = []
        self._acked = 0  # tickets below this are settled
        self._seq = seq
        self.commits = 0  # transactions the writer committed (group commit: fewer than records)
        self.failures = 0  # records that were not stored (each also logged to `policyc.audit`)
        self.stored = 0  # records this log made durable since it was opened
        self.commit_seconds = CommitTimes()  # the writer's commit (insert + fsync) times
        self._listeners: list[Callable[[], None]] = []
        self._settled = threading.Lock()
        self._waiters: dict[int, threading.Lock] = {}
        self._send = threading.Lock()
        self._queued = threading.Condition(self._send)
        self._frames: list[bytes] = []  # frames not yet in the pipe, in ticket order
        self._frame_bytes = 0
        self._next = 0
        self._closing = False
        self._closed = False
        self._stopped: str | None = None  # why the writer is gone, once it is
        self._ready = threading.Event()
        self._rotated: queue.Queue[bytes] = queue.Queue()
        self._rotating = threading.Lock()
        self._proc, self._out, self._acks = self._start_writer(cfg)
        self._reader = threading.Thread(target=self._read_acks, name=f"audit-acks:{path.name}", daemon=True)
        self._reader.start()
        self._sender = threading.Thread(target=self._pump, name=f"audit-send:{path.name}", daemon=True)
        self._sender.start()
        # Open means open: the writer has the log and its opening checkpoint is durable, so
        # a log that cannot be written is refused here rather than by every record later.
        if not self._ready.wait(_READY_TIMEOUT) or self._stopped is not None:
            why = self._stopped or f"the audit writer did not start within {_READY_TIMEOUT:g} s"
            self._abandon()
            raise AuditLogUnavailable(why if why.startswith(str(path)) else f"{path}: {why}")
        _OPEN.add(self)

    def _abandon(self) -> None:
        """Tear down a writer that never became ready."""
        with self._send:
            self._closing = True
            self._queued.notify_all()
        if self._proc.poll() is None:
            self._proc.kill()
        self._sender.join()
        self._reader.join()
        self._proc.wait()
        os.close(self._out)
        os.close(self._acks)

    def _start_writer(self, cfg: WriterConfig) -> tuple[subprocess.Popen[bytes], int, int]:
        """Start the writer process with the records pipe on its stdin and the lock file
        inherited (the lock is released only when both processes have let go of it)."""
        rec_r, rec_w = os.pipe()
        ack_r, ack_w = os.pipe()
        try:
            fcntl.fcntl(rec_w, _F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:
            pass  # a smaller pipe only means earlier back-pressure
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "policyc.audit.writer_process", str(ack_w)],
                stdin=rec_r, pass_fds=(ack_w, self._lock_file.fileno()), close_fds=True,
            )
        except OSError as e:
            for fd in (rec_r, rec_w, ack_r, ack_w):
                os.close(fd)
            raise AuditLogUnavailable(f"{self.path}: cannot start the audit writer process: {e}") from None
        os.close(rec_r)
        os.close(ack_w)
        write_all(rec_w, frame(ToWriter.INIT, dumps(cfg.to_wire())))
        return proc, rec_w, ack_r

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
        warm: bool = False,
    ) -> AuditLog:
        """Open (or create) the log at `path` for appending.

        `signing_key`: an ed25519 private key (or a path to one) that signs checkpoints;
        None writes unsigned checkpoints. `redact`: header names never stored.
        `durability="full"` survives power loss; "normal" survives a killed process only.
        `warm`: load the writer's draft encoder before returning (a decision service: its
        first decision drafts are then not delayed by ~0.1 s of imports). Returns once the
        writer process holds the log and has sealed its opening checkpoint.
        Raises AuditLogUnavailable (another writer holds it, not an audit log, ...) or
        AuditLogCorrupt (the chain's tail was altered: run `policyc audit verify`)."""
        p = Path(path)
        if not p.parent.is_dir():
            raise AuditLogUnavailable(f"{p}: directory `{p.parent}` does not exist")
        if p.exists() and not p.is_file():
            raise AuditLogUnavailable(f"{p}: not a regular file; an audit log is a file of its own")
        key = signing_key if signing_key is None or isinstance(signing_key, Ed25519PrivateKey) else checkpoints.load_private_key(os.fspath(signing_key))
        if p.exists() and not p.is_file():
            raise AuditLogUnavailable(f"{p}: not a regular file; an audit log is a file of its own")
        try:
            lock = open(f"{p}.lock", "a")  # noqa: SIM115 (held for the log's lifetime)
        except OSError as e:
            raise AuditLogUnavailable(f"{p}: cannot create the log's lock file `{p}.lock`: {e.strerror}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise AuditLogUnavailable(f"{p}: audit log is already open for writing by another process") from None
        try:
            if not p.exists() and closed_segments(p):
                _continue_rotation(p, durability)
            log = cls(
                p,
                lock,
                signing_key=key,
                redact=redact,
                checkpoint_every=checkpoint_every,
                checkpoint_interval=checkpoint_interval,
                durability=durability,
                warm=warm,
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
            return self._base, self._base_hash
        cp = self._conn.execute("SELECT seq, hash FROM checkpoints WHERE seq <= ? ORDER BY seq DESC LIMIT 1", (head,)).fetchone()
        if cp is not None:
            stored = self._conn.execute("SELECT hash FROM entries WHERE seq = ?", (cp[0],)).fetchone()
            if stored is None or stored[0] != cp[1]:
                raise AuditLogCorrupt(
                    f"{self.path}: entry {cp[0]} no longer has the hash its last checkpoint sealed; refusing to append. "
                    f"Run `policyc audit verify --log {self.path}`"
                )
        start = max(cp[0] if cp else self._base, head - 2 * self._every, self._base)
        if start == self._base:
            prev = self._base_hash
        else:
            row = self._conn.execute("SELECT hash FROM entries WHERE seq = ?", (start,)).fetchone()
            if row is None:
                raise AuditLogCorrupt(f"{self.path}: entry {start} is missing; run `policyc audit verify --log {self.path}`")
            prev = row[0]
        if not self._v1 and (missing := entries_columns_missing(self._conn)):
            raise AuditLogCorrupt(f"{self.path}: the entries table was redefined (no column {', '.join(missing)}); refusing to append. "
                                  f"Run `policyc audit verify --log {self.path}`")
        select = CHAIN_SELECT if self._v1 else INDEXED_CHAIN_SELECT
        result = walk(self._conn.execute(select + " WHERE seq > ? ORDER BY seq", (start,)), prev, start + 1, indexed=not self._v1)
        if result.problem is None and result.index_problem is not None:
            bad = result.index_problem
            raise AuditLogCorrupt(
                f"{self.path}: the chain's tail does not verify at seq {bad[0]} (index column `{bad[1]}` disagrees with the record); "
                f"refusing to append. Run `policyc audit verify --log {self.path}`"
            )
        if result.problem is None and self._v1 and not entries_definition_intact(self._conn):
            bad = first_inconsistent(self._conn, 1, result.last_seq) or (result.last_seq, "table definition")
            if bad is not None:
                raise AuditLogCorrupt(
                    f"{self.path}: the chain's tail does not verify at seq {bad[0]} (index column `{bad[1]}` disagrees with the record); "
                    f"refusing to append. Run `policyc audit verify --log {self.path}`"
                )
        if result.problem is not None:
            raise AuditLogCorrupt(
                f"{self.path}: the chain's tail does not verify at seq {result.problem.seq} ({result.problem.message}); "
                f"refusing to append. Run `policyc audit verify --log {self.path}`"
            )
        return result.last_seq, result.last_hash

    def _check_head(self, last_seq: int) -> None:
        """The sealed head beside the log (`head.py`) names a checkpoint of this segment that
        must still be in it: appending to a log cut back behind its head would replace the
        head, and with it the only evidence of the cut."""
        try:
            head = read_head(self.path)
        except HeadUnreadable as e:
            raise AuditLogCorrupt(f"{e}; refusing to append. Run `policyc audit verify --log {self.path}`") from None
        if head is None or head.segment < self._segment:
            return
        if head.log_id != self._log_id:
            raise AuditLogCorrupt(f"{self.path}.head: the sealed head belongs to another log (id {head.log_id}, this one {self._log_id}); "
                                  "refusing to append. Move the stray head away or run `policyc audit verify`")
        found = self._conn.execute("SELECT hash FROM checkpoints WHERE seq = ? AND time = ?", (head.seq, head.time)).fetchone()
        if head.segment > self._segment or last_seq < head.seq or found is None or bytes(found[0]).hex() != head.hash:
            raise AuditLogCorrupt(f"{self.path}: the log ends at entry {last_seq} but its sealed head names a checkpoint at entry {head.seq} "
                                  "that it no longer holds (entries or checkpoints were removed); refusing to append. "
                                  f"Run `policyc audit verify --log {self.path}`")

    # ------------------------------------------------------------------ appending

    def submit_decision(self, record: DecisionRecord) -> Receipt:
        """Queue a decision record (redacted here); wait on the receipt for durability."""
        if not isinstance(record, DecisionRecord):
            raise TypeError(f"submit_decision takes a DecisionRecord, not {type(record).__name__}")
        return self._submit(ToWriter.BODY, self._redactor.dump(record, record.request).encode())

    def submit_decision_draft(self, draft: DecisionDraft | DecisionWire) -> Receipt:
        """Queue a decision as plain values (`drafts.decision_draft`): the writer process
        validates, redacts and serialises it, so the caller pays a MessagePack encoding (a
        few µs) and no system call. A draft that does not validate is not stored: its receipt raises
        AuditWriteError, and it is counted in `failures` and logged. Raises TypeError at the
        call for a value that is not a plain one (`draft_encoder.wire_draft`)."""
        if not isinstance(draft, (dict, DecisionWire)):
            raise TypeError(f"submit_decision_draft takes a dict (DecisionDraft) or a DecisionWire, not {type(draft).__name__}")
        return self._submit(ToWriter.DRAFT, wire_draft(draft))

    def submit_decision_drafts(self, drafts: Sequence[DecisionDraft | DecisionWire], bodies: Sequence[bytes] = ()) -> int:
        """`submit_decision_draft` for many drafts in one hand-over (the server bridge's
        batches): one frame, one encoding call, one lock and one wake-up of the sender
        thread instead of one per draft; the writer decodes the batch in one call too.
        Returns the first draft's ticket: receipts are `Receipt(log, first + i)`; callers
        that do not wait need none. A draft may also be a `draft_encoder.DecisionWire` built
        directly (the server bridge's `wire_of`): it goes as is, and the writer validates it
        all the same. All or nothing at the call: a draft with a value that is
        not a plain one raises TypeError and none of them is queued.

        `bodies`: records already serialised (`submit_body`'s), queued after the drafts in
        the same hand-over, so the writer stores both in one commit (the bridge's per-call
        accounting records: one fsync shared with the decisions instead of one of their own);
        their tickets follow the drafts'."""
        if not drafts and not bodies:
            return self._next
        for draft in drafts:
            if not isinstance(draft, (dict, DecisionWire)):
                raise TypeError(f"submit_decision_drafts takes dicts (DecisionDraft) or DecisionWire, not {type(draft).__name__}")
        data = frame(ToWriter.DRAFTS, COUNT.pack(len(drafts)) + wire_drafts(drafts)) if drafts else b""
        if bodies:
            data += b"".join(frame(ToWriter.BODY, bytes(b)) for b in bodies)
        return self._submit_frames(data, len(drafts) + len(bodies))

    def submit_action(self, record: ActionRecord) -> Receipt:
        if not isinstance(record, ActionRecord):
            raise TypeError(f"submit_action takes an ActionRecord, not {type(record).__name__}")
        return self._submit(ToWriter.BODY, record.model_dump_json(exclude_none=True).encode())

    def append_decision(self, record: DecisionRecord) -> int:
        """Store a decision record; returns its seq once durable (that is the acknowledgement)."""
        return self.submit_decision(record).wait()

    def append_action(self, record: ActionRecord) -> int:
        """Store an enforcement / self-heal action; usable directly as the guardian's sink."""
        return self.submit_action(record).wait()

    def submit_body(self, body: bytes) -> Receipt:
        """Queue a record already serialised and redacted (its exact stored bytes). For
        callers that serialise records themselves, such as bulk imports and benchmarks."""
        return self._submit(ToWriter.BODY, bytes(body))

    def submit_bodies(self, bodies: Iterable[bytes]) -> list[Receipt]:
        """`submit_body` for many records in one pipe write (bulk imports)."""
        items = [bytes(b) for b in bodies]
        first = self._submit_frames(b"".join(frame(ToWriter.BODY, b) for b in items), len(items))
        return [Receipt(self, first + i) for i in range(len(items))]

    def _submit(self, kind: ToWriter, payload: bytes) -> Receipt:
        return Receipt(self, self._submit_frames(frame(kind, payload), 1))

    def _submit_frames(self, data: bytes, count: int) -> int:
        """Queue `count` record frames for the sender thread; returns the first one's ticket.
        No system call here: a decision thread that released the interpreter lock for a
        pipe write would queue again for it behind the other decision threads, and that
        hand-over cost more than the record (measured). Only a full queue (the writer
        behind by more than `_PIPE_BYTES` x 4) makes the caller wait."""
        with self._send:
            while self._frame_bytes > 4 * _PIPE_BYTES and not self._closing and self._stopped is None:
                self._queued.wait()
            if self._closing or self._stopped is not None:
                raise AuditWriteError(f"{self.path}: audit log is {'closed' if self._closing else 'stopped: ' + str(self._stopped)}")
            ticket = self._next
            self._next = ticket + count
            self._frames.append(data)
            self._frame_bytes += len(data)
            if len(self._frames) == 1:
                self._queued.notify_all()
        return ticket

    def _pump(self) -> None:
        """The sender thread: moves queued frames into the pipe, many per write."""
        while True:
            with self._send:
                while not self._frames and not self._closing:
                    self._queued.wait()
                frames, self._frames, self._frame_bytes = self._frames, [], 0
                closing = self._closing
                self._queued.notify_all()  # callers waiting for room
            try:
                if frames:
                    write_all(self._out, b"".join(frames))
                if closing:
                    write_all(self._out, frame(ToWriter.CLOSE, b""))
                    return
            except OSError as e:  # the writer is gone: the ack reader reports it to receipts
                with self._send:
                    if self._stopped is None:
                        self._stopped = f"audit writer is gone ({e.strerror}); records not stored"
                    self._queued.notify_all()
                return

    # ------------------------------------------------------------------ acknowledgements

    def _read_acks(self) -> None:
        buf = bytearray()
        why = "the audit writer process exited unexpectedly"
        try:
            while True:
                chunk = os.read(self._acks, 1 << 16)
                if not chunk:
                    break
                buf += chunk
                for kind, payload in split(buf):
                    if kind == FromWriter.ACK:
                        self._settle_range(Ack.decode(payload))
                    elif kind == FromWriter.READY:
                        self._ready.set()
                    elif kind == FromWriter.ROTATED:
                        self._rotated.put(payload)
                    elif kind == FromWriter.FATAL:
                        why = payload.decode(errors="replace")
                        _log.error("%s", why)
                    elif kind == FromWriter.CLOSED:
                        why = "closed"
                        if payload:
                            _log.error("%s", payload.decode(errors="replace"))
        finally:
            if why != "closed":
                try:  # say how it ended: "killed by signal 9" is what an operator needs to read
                    code = self._proc.wait(timeout=1.0)
                    why += f" (killed by signal {-code})" if code < 0 else f" (exit status {code})"
                except subprocess.TimeoutExpired:
                    pass
                if not self._closing:
                    _log.error("%s: %s; records not yet durable are lost", self.path, why)
            with self._settled:
                self._stopped = why
                for waiter in self._waiters.values():
                    waiter.release()
                self._waiters.clear()
            self._ready.set()
            self._tell_listeners()

    def _tell_listeners(self) -> None:
        for fn in self._listeners:
            try:
                fn()
            except Exception:  # noqa: BLE001 (a listener's bug must not stop acknowledgements)
                _log.exception("audit: acknowledgement listener failed")

    def on_settled(self, fn: Callable[[], None]) -> None:
        """Call `fn()` after each acknowledgement and once when the writer stops, on the
        log's acknowledgement thread (so `fn` must be quick and must not wait on the log)."""
        self._listeners.append(fn)

    @property
    def acked(self) -> int:
        """Tickets below this are settled (stored, or failed)."""
        return self._acked

    @property
    def submitted(self) -> int:
        """Tickets handed out so far (the next record gets this one)."""
        return self._next

    @property
    def queued_bytes(self) -> int:
        """Frames waiting for the sender thread (the pipe holds up to 1 MiB more)."""
        return self._frame_bytes

    @property
    def stopped(self) -> str | None:
        """Why the writer is gone ("closed" after `close`), or None while it runs."""
        return self._stopped

    @property
    def lost(self) -> int:
        """Records handed to this log that were not, and will never be, made durable:
        those the writer refused or could not store, and, once the writer is gone, every
        record it had not acknowledged."""
        with self._settled:
            gone = self._next - self._acked if self._stopped is not None else 0
            return self.failures + gone

    def unstored(self, first: int, end: int) -> int:
        """How many of tickets `first`..`end - 1` are not stored (failed, or unsettled
        once the writer is gone; unsettled tickets of a running writer are not counted)."""
        with self._settled:
            n = sum(max(0, min(hi, end) - max(lo, first)) for lo, hi, _ in self._failed)
            if self._stopped is not None:
                n += max(0, end - max(first, self._acked))
            return n

    def settled(self, ticket: int) -> int:
        """The seq of a settled ticket (`ticket < acked`, or the writer stopped), without
        waiting; raises AuditWriteError if its record was not stored."""
        return self._settle(ticket, 0)

    def _settle_range(self, ack: Ack) -> None:
        with self._settled:
            delta = ack.seq_base - ack.first
            if delta != self._seg_delta[-1]:
                self._seg_start.append(ack.first)
                self._seg_delta.append(delta)
            for lo, hi, message in ack.failed:
                self._failed.append((lo, hi, message))
                delta -= hi - lo
                self._seg_start.append(hi)
                self._seg_delta.append(delta)
                self.failures += hi - lo
                _log.error("audit: %d record(s) not stored: %s", hi - lo, message)
            self._acked = ack.end
            self._seq = ack.last_seq
            self.commits = ack.commits
            self.stored += ack.end - ack.first - sum(hi - lo for lo, hi, _ in ack.failed)
            if ack.commit_s >= 0:
                self.commit_seconds.observe(ack.commit_s)
            for ticket in [t for t in self._waiters if t < ack.end]:
                self._waiters.pop(ticket).release()
        self._tell_listeners()

    def _settle(self, ticket: int, timeout: float | None) -> int:
        # One lock per waiting ticket, released by the acknowledgement that covers it: each
        # ack wakes only the threads it settles (a shared condition would wake them all,
        # each then queueing for this interpreter's lock).
        with self._settled:
            waiter = None
            if self._acked <= ticket and self._stopped is None:
                waiter = self._waiters.get(ticket)
                if waiter is None:
                    waiter = self._waiters[ticket] = threading.Lock()
                    waiter.acquire()
        if waiter is not None and waiter.acquire(timeout=-1 if timeout is None else timeout):
            waiter.release()  # another wait() on the same receipt may hold it too
        with self._settled:
            if self._acked <= ticket and self._stopped is None:
                raise AuditWriteError(f"{self.path}: audit record not durable after {timeout} s")
            if self._acked <= ticket:
                raise AuditWriteError(f"{self.path}: audit record was not stored: {self._stopped}")
            for lo, hi, message in reversed(self._failed):
                if lo <= ticket < hi:
                    raise AuditWriteError(f"{self.path}: audit record was not stored: {message}")
            return ticket + self._seg_delta[bisect.bisect_right(self._seg_start, ticket) - 1]

    # ------------------------------------------------------------------ closing

    def checkpoint(self) -> None:
        """Seal the chain now (as the periodic checkpoint would)."""
        with self._send:
            if not self._closing and self._stopped is None:
                self._frames.append(frame(ToWriter.CHECKPOINT, b""))
                self._queued.notify_all()

    def rotate(self, timeout: float = 120.0) -> int:
        """Close the live segment (everything submitted before this call goes into it) with
        a signed close record, move it to `<log>.segments/`, and go on in a new live segment
        chained to it (`segments.py`). Records submitted meanwhile wait in the pipe and land
        in the new segment: nothing is lost. Returns the closed segment's number; raises
        AuditWriteError when the writer refused (nothing to close, readers in the way) or
        is gone."""
        with self._rotating:
            with self._send:
                if self._closing or self._stopped is not None:
                    raise AuditWriteError(f"{self.path}: audit log is {'closed' if self._closing else 'stopped: ' + str(self._stopped)}")
                self._frames.append(frame(ToWriter.ROTATE, b""))
                self._queued.notify_all()
            deadline = time.monotonic() + timeout
            while True:
                try:
                    answer = json.loads(self._rotated.get(timeout=0.2))
                    break
                except queue.Empty:
                    if self._stopped is not None:
                        raise AuditWriteError(f"{self.path}: rotation not done: {self._stopped}") from None
                    if time.monotonic() > deadline:
                        raise AuditWriteError(f"{self.path}: rotation not answered within {timeout:g} s") from None
            if "error" in answer:
                raise AuditWriteError(str(answer["error"]))
            return int(answer["segment"])

    @property
    def last_seq(self) -> int:
        """The last seq the writer has made durable."""
        return self._seq

    def close(self) -> None:
        """Flush what is queued, write a final checkpoint, release the log."""
        with self._send:
            if self._closing:
                return
            self._closing = True
            self._queued.notify_all()
        _OPEN.discard(self)
        self._sender.join()  # everything queued, then CLOSE, is in the pipe
        self._reader.join()
        self._proc.wait()
        os.close(self._out)
        os.close(self._acks)
        self._closed = True
        self._lock_file.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _continue_rotation(path: Path, durability: Durability) -> None:
    """A rotation cut short after the live file was moved (the writer died between the move
    and the new file): start the next segment from the last closed one, as it would have."""
    number, last = closed_segments(path)[-1]
    conn = connect_reader(last)
    try:
        lid = log_id(conn)
        _, base, base_hash = segment_base(conn)
        row = conn.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
    finally:
        conn.close()
    seq, h = (row[0], bytes(row[1])) if row else (base, base_hash or genesis(lid))
    _log.warning("%s: the live segment is missing after segment %d was closed; starting segment %d after entry %d", path, number, number + 1, seq)
    create_segment(path, lid, number + 1, seq, h, durable=durability == "full")


class CommitTimes:
    """A histogram of the writer's commit times (seconds), read by the metrics endpoint."""

    BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BOUNDS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.BOUNDS, seconds)] += 1
        self.total += seconds


__all__ = ["AuditLog", "Receipt", "AuditError"]
