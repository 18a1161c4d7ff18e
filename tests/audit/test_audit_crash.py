"""Durability: kill -9 in the middle of a stream of appends loses no acknowledged record;
a torn last write is detected, repaired on reopen, and the repair itself is audited."""

from __future__ import annotations

import os
import signal
import sqlite3
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from audit_helpers import decision

from policyc.audit.errors import AuditLogCorrupt, AuditLogUnavailable
from policyc.audit.log import AuditLog
from policyc.audit.query import AuditReader
from policyc.audit.records import ActionRecord, EntryKind
from policyc.audit.verify import verify
from policyc.audit.wal import _checksum, inspect_wal

HERE = Path(__file__).parent

CHILD = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, sys.argv[2])
    from audit_helpers import decision
    from policyc.audit.log import AuditLog

    log = AuditLog.open(sys.argv[1], checkpoint_every=100)
    out = threading.Lock()

    def worker(w):
        i = 0
        while True:
            rec = decision(w * 1_000_000 + i)
            seq = log.append_decision(rec)  # returns once durable: the acknowledgement
            with out:
                sys.stdout.write(f"{seq} {rec.decision_id}\\n")
                sys.stdout.flush()
            i += 1

    for w in range(8):
        threading.Thread(target=worker, args=(w,), daemon=True).start()
    threading.Event().wait()
    """
)


def _tear_wal(db: Path) -> int:
    """Leave the WAL as a crash during a frame write would: a frame of the current
    generation (right salts) cut short at the end. Returns the byte offset of the tear."""
    wal = Path(f"{db}-wal")
    data = wal.read_bytes()
    page = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    pos = 32
    while pos + 24 + page <= len(data) and data[pos + 8 : pos + 16] == salts:
        pos += 24 + page
    torn = struct.pack(">II", 2, 0) + salts + b"\x00" * 8 + os.urandom(page // 3)
    with wal.open("r+b") as f:
        f.seek(pos)
        f.write(torn)
        f.truncate()
    return pos


def _run_child_and_kill(db: Path, acks_wanted: int) -> dict[int, str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(HERE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked: dict[int, str] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seq, did = line.split()
            acked[int(seq)] = did
            if len(acked) >= acks_wanted:
                break
        else:
            pytest.fail(f"child exited early: {proc.stderr.read() if proc.stderr else ''}")
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: other threads are appending right now
        rest = proc.stdout.read()  # acknowledgements printed before the kill landed
        for line in rest.splitlines():
            parts = line.split()
            if len(parts) == 2 and line.endswith(parts[1]):
                acked[int(parts[0])] = parts[1]
    finally:
        proc.kill()
        proc.wait()
    return acked


def test_kill_9_loses_no_acknowledged_record_and_torn_tail_is_repaired(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    acked = _run_child_and_kill(db, acks_wanted=600)
    assert Path(f"{db}-wal").exists(), "the writer should have been killed with its WAL open"
    _tear_wal(db)
    assert inspect_wal(db).torn
    before = verify(db)
    assert before.ok, before.problems  # readers already ignore the torn tail
    assert any("torn tail" in n for n in before.notes)

    with AuditLog.open(db, checkpoint_every=100) as log:
        assert log.recovery.torn and "cut short" in log.recovery.reason
        more = log.append_decision(decision(424242))
    assert not inspect_wal(db).torn

    report = verify(db)
    assert report.ok, report.problems
    with AuditReader.open(db) as reader:
        for seq, did in acked.items():
            entry = reader.decision(did)
            assert entry is not None and entry.seq == seq, f"acknowledged record {seq} ({did}) lost"
        repairs = [e for e in reader.entries(kind=EntryKind.ACTION) if isinstance(e.record, ActionRecord) and e.record.kind == "log_recovered"]
        assert len(repairs) == 1 and "discarded" in repairs[0].record.detail
        assert repairs[0].seq < more
    assert report.last_seq == more


def test_kill_9_without_tearing_reopens_cleanly(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    acked = _run_child_and_kill(db, acks_wanted=150)
    with AuditLog.open(db) as log:
        assert log.last_seq >= max(acked)
    assert verify(db).ok


def test_uncommitted_transaction_in_wal_is_reported(tmp_path: Path) -> None:
    """Whole frames with valid checksums but no commit frame: a transaction the crash cut off."""
    db = tmp_path / "t.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    wal = Path(f"{db}-wal")
    data = bytearray(wal.read_bytes())  # read while the connection is open, as a crash leaves it
    big = data[0:4] == b"\x37\x7f\x06\x83"
    page = struct.unpack(">I", data[8:12])[0]
    frame = 24 + page
    last = data[-frame:]
    s0, s1 = struct.unpack(">II", last[16:24])
    header = struct.pack(">II", 2, 0) + bytes(last[8:16])
    body = bytes(last[24:])
    c0, c1 = _checksum(header[:8], big, s0, s1)
    c0, c1 = _checksum(body, big, c0, c1)
    snapshot = tmp_path / "snap.db"
    snapshot.write_bytes(db.read_bytes())
    Path(f"{snapshot}-wal").write_bytes(bytes(data) + header + struct.pack(">II", c0, c1) + body)
    conn.close()
    tail = inspect_wal(snapshot)
    assert tail.torn and tail.uncommitted_frames == 1 and "no commit frame" in tail.reason
    assert tail.torn_bytes == frame


def test_second_writer_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditLog.open(db):
        with pytest.raises(AuditLogUnavailable, match="already open for writing"):
            AuditLog.open(db)


def test_altered_tail_is_refused_on_open(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditLog.open(db, checkpoint_every=1000) as log:
        for i in range(20):
            log.submit_decision(decision(i))
        log.append_decision(decision(99))
    with sqlite3.connect(db) as c:
        c.execute("UPDATE entries SET body = CAST(replace(CAST(body AS TEXT), 'acme', 'evil') AS BLOB) WHERE seq = 15")
        c.execute("DELETE FROM checkpoints")  # entry 15 is now past the last checkpoint: the tail
    with pytest.raises(AuditLogCorrupt, match="seq 15"):
        AuditLog.open(db)
    assert not verify(db).ok


def test_rehashed_sealed_entries_are_refused_on_open(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditLog.open(db, checkpoint_every=1000) as log:
        log.append_decision(decision(1))
    with sqlite3.connect(db) as c:
        c.execute("UPDATE entries SET hash = zeroblob(32) WHERE seq = 1")
    with pytest.raises(AuditLogCorrupt, match="checkpoint"):
        AuditLog.open(db)


def test_group_commit_shares_commits_across_threads(tmp_path: Path) -> None:
    import threading

    db = tmp_path / "audit.db"
    with AuditLog.open(db) as log:
        def work(w: int) -> None:
            for i in range(40):
                log.append_decision(decision(w * 1000 + i))

        threads = [threading.Thread(target=work, args=(w,)) for w in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert log.last_seq == 640
        assert log.commits < 640 / 2, f"{log.commits} commits for 640 records: no group commit"
    assert verify(db).ok
