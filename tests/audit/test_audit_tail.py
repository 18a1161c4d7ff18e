"""The log's end (issue 36): the three tamperings `verify` used to miss, reproduced as an
attacker with write access to the log's directory (not the signing key) would do them:

- the last entries deleted together with the checkpoints that sealed them, no anchor;
- only the final checkpoint (the close record) deleted, no anchor;
- the final checkpoint deleted, verified with `--anchor`.

The sealed head beside the log (`audit/head.py`) names the last checkpoint, so the first two
fail verification; with the head deleted as well, nothing in the directory proves the end
and the verdict is amber, never green; an anchor must still be in the log, so the third fails.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from audit_helpers import fill
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.audit.errors import AuditLogCorrupt
from policyc.audit.head import head_path, read_head
from policyc.audit.log import AuditLog
from policyc.audit.verify import ProblemKind, verify
from policyc.cli.main import main

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(7, 39)))
PUB = KEY.public_key()
N = 220  # 200 decisions + 20 actions; checkpoints every 50 and the close record at 220


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tail") / "audit.db"
    fill(path, 200, key=KEY)
    return path


@pytest.fixture
def log(pristine: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "audit.db"
    shutil.copy(pristine, dst)
    shutil.copy(head_path(pristine), head_path(dst))
    return dst


def _sql(path: Path, *statements: str) -> None:
    with sqlite3.connect(path) as db:
        for s in statements:
            db.execute(s)


def test_untouched_log_with_key_is_green_and_without_is_amber(log: Path) -> None:
    head = read_head(log)
    assert head is not None and head.final and head.seq == N and head.signature is not None
    green = verify(log, public_key=PUB)
    assert green.ok and green.tail_proven and green.verdict == "green", green.unproven
    plain = verify(log)
    assert plain.ok and plain.verdict == "amber"
    assert any("signatures were not checked" in why for why in plain.unproven)


def test_tail_rows_deleted_with_their_checkpoints_fail_without_an_anchor(log: Path) -> None:
    _sql(log, "DELETE FROM entries WHERE seq > 180", "DELETE FROM checkpoints WHERE seq > 180")
    for key in (PUB, None):
        report = verify(log, public_key=key)
        first = report.first_bad
        assert first is not None and (first.seq, first.kind) == (181, ProblemKind.TRUNCATED), report.problems
        assert "181..220" in first.message and report.verdict == "red"


def test_tail_rows_deleted_with_checkpoints_and_head_are_amber_never_green(log: Path) -> None:
    _sql(log, "DELETE FROM entries WHERE seq > 150", "DELETE FROM checkpoints WHERE seq > 150")
    head_path(log).unlink()
    report = verify(log, public_key=PUB)
    assert report.ok and not report.tail_proven and report.verdict == "amber"  # nothing left proves the end
    assert any("end is unproven" in why for why in report.unproven), report.unproven


def test_final_checkpoint_deleted_fails_without_an_anchor(log: Path) -> None:
    _sql(log, "DELETE FROM checkpoints WHERE final = 1 AND seq = 220")
    for key in (PUB, None):
        report = verify(log, public_key=key)
        first = report.first_bad
        assert first is not None and (first.seq, first.kind) == (N, ProblemKind.CHECKPOINT_DELETED), report.problems
        assert "close record" in first.message


def test_final_checkpoint_and_head_deleted_are_amber(log: Path) -> None:
    _sql(log, "DELETE FROM checkpoints WHERE final = 1 AND seq = 220")
    head_path(log).unlink()
    report = verify(log, public_key=PUB)
    assert report.ok and report.verdict == "amber" and not report.closed
    assert any("201..220 are not sealed" in why for why in report.unproven), report.unproven


def test_final_checkpoint_deleted_fails_with_an_anchor(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    anchor = verify(log, public_key=PUB).last_checkpoint
    assert anchor is not None and anchor.final and anchor.seq == N
    _sql(log, "DELETE FROM checkpoints WHERE final = 1 AND seq = 220")
    head_path(log).unlink()  # the anchor alone must catch it
    report = verify(log, public_key=PUB, anchor=anchor)
    first = report.first_bad
    assert first is not None and (first.seq, first.kind) == (N, ProblemKind.CHECKPOINT_DELETED), report.problems
    # the same through the CLI, with the anchor as a file and as SEQ:HASH
    (tmp_path / "anchor.json").write_text(json.dumps({"last_checkpoint": anchor.model_dump(mode="json")}))
    pub = tmp_path / "op.pub"
    pub.write_bytes(PUB.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    for a in (str(tmp_path / "anchor.json"), f"{anchor.seq}:{anchor.hash}"):
        code = main(["audit", "verify", "--log", str(log), "--public-key", str(pub), "--anchor", a])
        out = capsys.readouterr().out
        assert code == 1 and "checkpoint_deleted" in out, out


def test_forged_head_is_refused_with_the_key(log: Path) -> None:
    raw = json.loads(head_path(log).read_text())
    raw["seq"] = 150  # an attacker rolls the head back to match a cut log
    head_path(log).write_text(json.dumps(raw))
    report = verify(log, public_key=PUB)
    assert {p.kind for p in report.problems} == {ProblemKind.HEAD_ALTERED}, report.problems


def test_open_refuses_to_append_behind_its_head(log: Path) -> None:
    """Appending would replace the head and bury the cut: refused, with verify named."""
    _sql(log, "DELETE FROM entries WHERE seq > 180", "DELETE FROM checkpoints WHERE seq > 180")
    with pytest.raises(AuditLogCorrupt, match="sealed head names a checkpoint at entry 220"):
        AuditLog.open(log, signing_key=KEY)


def test_strict_fails_amber(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "verify", "--log", str(log)]) == 0  # amber: no key
    assert "verdict: amber" in capsys.readouterr().out
    assert main(["audit", "verify", "--log", str(log), "--strict"]) == 1
    capsys.readouterr()
