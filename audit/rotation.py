"""Rotating and pruning a log from outside its writer: what `policyc audit rotate` does.

A log that no process holds is opened, rotated (`AuditLog.rotate`) and closed here. A log
held by a running writer (the decision service's) is asked to rotate by a signal to its
writer process, whose pid it keeps in `<log>.writer`; the writer rotates at its next batch
boundary, so every record handed to it before lands in the closing segment and every later
one in the next, and answers in `<log>.rotated`. Before signalling, the pid is checked to
be that log's writer process (its command line and the log's lock being held), so a stale
pid file never signals another process.

Retention (`prune`) removes only closed segments, oldest first, whose last entry is older
than the retention, and only after the whole log verifies and the record that proves the
gap (`segments.record_pruned`: each removed segment's range and signed close record) is
durable.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import AuditError, AuditInputError, AuditLogUnavailable, AuditWriteError
from .log import AuditLog
from .segments import PrunedSegment, closed_segments, record_pruned
from .store import connect_reader, segment_base
from .writer_process import ROTATE_SIGNAL, rotated_path, writer_pid_path


def _held(log: Path) -> bool:
    """Whether a writer holds the log's lock now."""
    try:
        with open(f"{log}.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except OSError as e:
        raise AuditLogUnavailable(f"{log}: cannot open the log's lock file: {e.strerror}") from None


def rotate(log: str | os.PathLike[str], *, signing_key: Ed25519PrivateKey | None = None, timeout: float = 60.0) -> int:
    """Close the log's live segment and start the next; returns the closed segment's
    number. Works on a log no one holds (then `signing_key` signs the close and the
    opening, as the log's writer would) and on one a running writer holds (it signs with
    its own key)."""
    p = Path(log)
    if not p.is_file():
        raise AuditLogUnavailable(f"{p}: no audit log here")
    if not _held(p):
        try:
            with AuditLog.open(p, signing_key=signing_key, durability="full") as opened:
                return opened.rotate(timeout)
        except AuditLogUnavailable as e:
            if "already open" not in str(e):
                raise
    return _signal_writer(p, timeout)


def _signal_writer(p: Path, timeout: float) -> int:
    pid_file = writer_pid_path(str(p))
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        raise AuditWriteError(f"{p}: the log is held by a writer, but `{pid_file}` does not name a running one") from None
    if b"policyc.audit.writer_process" not in cmdline or not _held(p):
        raise AuditWriteError(f"{p}: process {pid} named by `{pid_file}` is not this log's writer; not signalled")
    status = rotated_path(str(p))
    before = status.stat().st_mtime_ns if status.exists() else 0
    os.kill(pid, ROTATE_SIGNAL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status.exists() and status.stat().st_mtime_ns != before:
            try:
                answer = json.loads(status.read_text())
            except (OSError, ValueError):
                time.sleep(0.05)
                continue
            if "error" in answer:
                raise AuditWriteError(str(answer["error"]))
            return int(answer["segment"])
        time.sleep(0.05)
    raise AuditWriteError(f"{p}: the writer (pid {pid}) did not answer the rotation within {timeout:g} s")


def prune(log: str | os.PathLike[str], retain: float, *, public_key: Ed25519PublicKey | None = None,
          now: float | None = None) -> list[PrunedSegment]:
    """Remove the closed segments whose last entry is older than `retain` seconds (oldest
    first, stopping at the first one to keep), after recording what proves the gap.
    Refuses (AuditError) when the log does not verify: a damaged segment is evidence."""
    from .verify import verify

    p = Path(log)
    now = time.time() if now is None else now
    report = verify(p, public_key=public_key)
    if not report.ok:
        first = report.first_bad
        raise AuditError(f"{p}: not pruning a log that fails verification ({first}); run `policyc audit verify`")
    drop: list[tuple[Path, PrunedSegment]] = []
    for number, path in closed_segments(p):
        item = _summary(path, number, now)
        if item.last_time is None or item.last_time >= now - retain:
            break
        drop.append((path, item))
    if not drop:
        return []
    record_pruned(p, [item for _, item in drop])  # durable before anything is removed
    for path, _ in drop:
        path.unlink()
        for side in ("-wal", "-shm"):
            Path(f"{path}{side}").unlink(missing_ok=True)
    return [item for _, item in drop]


def _summary(path: Path, number: int, now: float) -> PrunedSegment:
    from .checkpoints import Checkpoint

    conn = connect_reader(path)
    try:
        _, base, _ = segment_base(conn)
        last_seq, t0, t1 = conn.execute("SELECT max(seq), min(time), max(time) FROM entries").fetchone()
        row = conn.execute("SELECT id, seq, hash, time, final, public_key, signature FROM checkpoints WHERE final = 1 AND seq = ? "
                           "ORDER BY id DESC LIMIT 1", (last_seq,)).fetchone()
        kept = conn.execute("SELECT opens, sealed FROM checkpoints WHERE id = ?", (row[0],)).fetchone() if row else None
    finally:
        conn.close()
    if row is None or last_seq is None:
        raise AuditInputError(f"{path}: closed segment {number} has no close record at its last entry; not pruned")
    import hashlib

    digest = hashlib.sha256(kept[1]).hexdigest() if kept is not None and isinstance(kept[1], bytes) else None
    close = Checkpoint(id=row[0], seq=row[1], hash=bytes(row[2]).hex(), time=row[3], final=bool(row[4]), public_key=row[5],
                       signature=row[6], opens=bool(kept[0]) if kept else False, sealed_digest=digest)
    return PrunedSegment(number, base + 1, last_seq, t0, t1, close, now)
