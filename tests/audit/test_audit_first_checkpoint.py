"""A new log is sealed with its first batch, so a young log that crashed inside its first
checkpoint interval (60 s by default) and was then emptied or cut short is caught by
`verify`; before, it had no checkpoint at all and verified clean."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.audit.verify import ProblemKind, verify

HERE = Path(__file__).parent
KEY = Ed25519PrivateKey.generate()

CHILD = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, sys.argv[2])
    from audit_helpers import decision
    from cryptography.hazmat.primitives import serialization
    from policyc.audit.log import AuditLog

    key = serialization.load_pem_private_key(open(sys.argv[3], "rb").read(), None)
    log = AuditLog.open(sys.argv[1], signing_key=key)  # the defaults: every 10,000 entries or 60 s
    for i in range(5):
        log.append_decision(decision(i))  # returns once durable
    print("durable", flush=True)
    threading.Event().wait()
    """
)


def young_log(tmp_path: Path) -> Path:
    """A fresh log with 5 durable decisions whose process was killed -9 a moment later."""
    path, key = tmp_path / "young.db", tmp_path / "key.pem"
    key.write_bytes(KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(HERE), str(key)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "durable"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    return path


def test_a_young_log_has_a_signed_checkpoint_before_its_first_interval(tmp_path: Path) -> None:
    path = young_log(tmp_path)
    with sqlite3.connect(path) as db:
        seals = db.execute("SELECT seq, final, signature FROM checkpoints ORDER BY seq").fetchall()
    assert seals and seals[0][0] >= 1 and seals[0][1] == 0 and seals[0][2]  # the first batch, signed, not a close
    report = verify(path, public_key=KEY.public_key())
    assert report.ok, report.problems
    assert report.checkpoints >= 1 and report.sealed_seq >= 1


def test_a_young_log_emptied_after_a_crash_no_longer_verifies(tmp_path: Path) -> None:
    path = young_log(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM entries")  # every record of the young log removed
    report = verify(path, public_key=KEY.public_key())
    assert not report.ok
    assert report.first_bad is not None and report.first_bad.kind in (ProblemKind.TRUNCATED, ProblemKind.DELETED), str(report.first_bad)


def test_count_checkpoints_stay_at_multiples_whatever_the_first_seal(tmp_path: Path) -> None:
    """The first batch's seal lands wherever that batch ends (here after 3 entries); the
    count checkpoints stay at 50, 100, 150 (they once shifted to 53, 103, 153, so where a
    log's checkpoints fall depended on batch timing)."""
    import time

    from audit_helpers import decision

    from policyc.audit.log import AuditLog

    path = tmp_path / "audit.db"
    with AuditLog.open(path, checkpoint_every=50, durability="normal") as log:
        for r in [log.submit_decision(decision(i)) for i in range(3)]:
            r.wait()
        time.sleep(0.2)  # the writer commits the first three alone
        for r in [log.submit_decision(decision(i)) for i in range(3, 200)]:
            r.wait()
    with sqlite3.connect(path) as db:
        seqs = [s for (s,) in db.execute("SELECT seq FROM checkpoints ORDER BY seq")]
    assert seqs[0] == 3 and {50, 100, 150, 200} <= set(seqs), seqs
