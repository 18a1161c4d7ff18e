"""Rotation and retention: a log cut into segments loses nothing and still verifies.

- rotation under load: writers keep submitting while the log rotates twice; every receipt
  is acknowledged with a distinct seq, and `verify` walks the three segments, green;
- `policyc audit rotate` against a log another process is writing (a real writer process,
  signalled), and against a log no one holds;
- `--retain` prunes only closed segments, only after recording their signed close records,
  and verify still proves the chain from there; removing a segment by hand is caught.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from audit_helpers import decision, fill
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.audit.log import AuditLog
from policyc.audit.rotation import prune
from policyc.audit.segments import closed_segments, pruned, segments_dir
from policyc.audit.verify import ProblemKind, verify
from policyc.cli.main import main

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(11, 43)))
PUB = KEY.public_key()


def _keys(d: Path) -> tuple[Path, Path]:
    priv, pub = d / "op.key", d / "op.pub"
    priv.write_bytes(KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    pub.write_bytes(PUB.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def test_rotation_under_load_loses_nothing_and_verify_walks_three_segments(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    receipts: list = []
    stop = threading.Event()
    with AuditLog.open(path, signing_key=KEY, checkpoint_every=200, durability="normal") as log:

        def load(w: int) -> None:
            i = 0
            while not stop.is_set():
                receipts.append(log.submit_decision(decision(w * 1_000_000 + i)))
                i += 1
                if i % 50 == 0:
                    time.sleep(0.001)

        threads = [threading.Thread(target=load, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        for _ in range(2):
            while log.acked < len(receipts) // 2 + 300:  # rotate while records are in flight
                time.sleep(0.01)
            assert log.rotate() >= 1
        time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        seqs = [r.wait(timeout=60) for r in receipts]
        assert log.lost == 0
    assert sorted(seqs) == list(range(1, len(receipts) + 1))  # every record stored once, none lost
    assert [n for n, _ in closed_segments(path)] == [1, 2]
    report = verify(path, public_key=PUB)
    assert report.ok, report.problems
    assert report.segments == 3 and report.entries == len(receipts) and report.verdict == "green", report.unproven


def test_cli_rotates_a_log_another_process_is_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.db"
    script = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from audit_helpers import decision\n"
        "from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey\n"
        "from policyc.audit.log import AuditLog\n"
        f"log = AuditLog.open({str(path)!r}, signing_key=Ed25519PrivateKey.from_private_bytes(bytes(range(11, 43))), durability='normal')\n"
        "print('ready', flush=True)\n"
        "i = 0\n"
        "while not sys.stdin.closed:\n"
        "    log.submit_decision(decision(i)).wait(); i += 1\n"
        "    if i % 20 == 0:\n"
        "        import select\n"
        "        if select.select([sys.stdin], [], [], 0)[0]: break\n"
        "log.close()\n"
        "print(i, flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        assert main(["audit", "rotate", "--log", str(path)]) == 0
        assert "closed segment 1" in capsys.readouterr().out
        time.sleep(0.3)
        assert main(["audit", "rotate", "--log", str(path)]) == 0
        time.sleep(0.3)
        assert proc.stdin is not None
        proc.stdin.write("stop\n")
        proc.stdin.close()
        written = int(proc.stdout.readline())
    finally:
        proc.wait(timeout=60)
    report = verify(path, public_key=PUB, expect_closed=True)
    assert report.ok and report.segments == 3 and report.entries == written and report.verdict == "green", (report.problems, report.unproven)


def test_rotate_a_log_no_one_holds_then_retain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.db"
    priv, pub = _keys(tmp_path)
    old = time.time() - 30 * 86400
    fill(path, 9, key=KEY, t0=old)  # a month old (9: no action, whose time would be today)
    assert main(["audit", "rotate", "--log", str(path), "--signing-key", str(priv)]) == 0
    fill(path, 9, key=KEY, t0=old + 1000)
    assert main(["audit", "rotate", "--log", str(path), "--signing-key", str(priv)]) == 0
    fill(path, 40, key=KEY)  # today
    capsys.readouterr()
    before = verify(path, public_key=PUB)
    assert before.ok and before.segments == 3 and before.verdict == "green"
    assert main(["audit", "rotate", "--log", str(path), "--retain", "7d", "--no-rotate", "--public-key", str(pub)]) == 0
    out = capsys.readouterr().out
    assert "pruned segment 1" in out and "pruned segment 2" in out
    gone = pruned(path)
    assert [g.segment for g in gone] == [1, 2] and gone[-1].close.final and gone[-1].close.signature
    assert closed_segments(path) == []
    after = verify(path, public_key=PUB)
    assert after.ok and after.verdict == "green", (after.problems, after.unproven)
    assert after.pruned_through == before.entries - 44 and after.entries == 44
    assert main(["audit", "verify", "--log", str(path), "--public-key", str(pub)]) == 0
    assert "pruned by retention" in capsys.readouterr().out


def test_retain_keeps_recent_segments_and_the_live_one(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    fill(path, 20, key=KEY)
    with AuditLog.open(path, signing_key=KEY, durability="normal") as log:
        log.rotate()
    assert prune(path, 86400, public_key=PUB) == []  # the closed segment is recent
    assert len(closed_segments(path)) == 1


def test_a_removed_or_tampered_segment_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    for _ in range(3):
        fill(path, 20, key=KEY)
        with AuditLog.open(path, signing_key=KEY, durability="normal") as log:
            log.rotate()
    assert verify(path, public_key=PUB).ok
    segs = closed_segments(path)
    os.rename(segs[1][1], tmp_path / "aside.db")  # segment 2 removed by hand
    report = verify(path, public_key=PUB)
    first = report.first_bad
    assert first is not None and first.kind is ProblemKind.SEGMENT_BROKEN and "segments were removed" in first.message
    os.rename(tmp_path / "aside.db", segs[1][1])
    # a pruned record whose close record was altered no longer proves the gap
    prune(path, -1e9, public_key=PUB)  # retention of "everything closed": prunes segments 1..3
    doc = json.loads((segments_dir(path) / "pruned.json").read_text())
    doc["segments"][-1]["close"]["hash"] = "00" * 32
    (segments_dir(path) / "pruned.json").write_text(json.dumps(doc))
    assert not verify(path, public_key=PUB).ok


def test_a_rotation_cut_short_after_the_move_is_completed_on_open(tmp_path: Path) -> None:
    """The writer died between moving the live file into the segments and creating the next
    one: opening the log starts the next segment chained to the last closed one."""
    path = tmp_path / "audit.db"
    fill(path, 30, key=KEY)  # closed cleanly: its head names its close record
    segments_dir(path).mkdir()
    os.rename(path, segments_dir(path) / "000001.db")
    fill(path, 10, key=KEY)
    report = verify(path, public_key=PUB)
    assert report.ok and report.segments == 2 and report.entries == 44 and report.verdict == "green", (report.problems, report.unproven)


def test_rotation_refused_while_a_reader_holds_the_log_and_the_log_stays_whole(tmp_path: Path) -> None:
    """A reader's snapshot keeps committed pages in the WAL: moving the file would lose them,
    so the rotation is refused, the log reopened after its close record, and it verifies."""
    import sqlite3

    from policyc.audit.errors import AuditWriteError

    path = tmp_path / "audit.db"
    with AuditLog.open(path, signing_key=KEY, durability="normal") as log:
        for i in range(20):
            log.append_decision(decision(i))
        reader = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM entries").fetchone()  # a snapshot held open
        log.append_decision(decision(20))  # a page the reader's snapshot does not have
        with pytest.raises(AuditWriteError, match="reader kept the write-ahead log busy"):
            log.rotate()
        reader.close()
        log.append_decision(decision(21))
        assert log.rotate() == 1  # once the reader is gone
    report = verify(path, public_key=PUB)
    assert report.ok and report.segments == 2 and report.entries == 22, report.problems
