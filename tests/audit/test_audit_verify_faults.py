"""`verify` against what a careless operator or an attacker leaves behind: a damaged file
(zeroed page, truncated, empty), a forged entry appended after the close record, a chain
rewritten and re-hashed from entry 150, trailing rows deleted with their checkpoints. Each
gets a located problem and a clean exit code, never a traceback; a legitimate reopening
after a clean close is not mistaken for an append."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from audit_helpers import decision, fill
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.audit.chain import digest
from policyc.audit.errors import AuditLogCorrupt, AuditLogDamaged
from policyc.audit.index_columns import index_row
from policyc.audit.log import AuditLog
from policyc.audit.store import ENTRY_INSERT, PAGE_SIZE
from policyc.audit.verify import ProblemKind, verify
from policyc.cli.main import main

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(2, 34)))
PUB = KEY.public_key()
N = 440  # 400 decisions + 40 actions


@pytest.fixture(scope="module")
def closed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A signed log closed cleanly, checkpointed as `policyc serve` does: every 10,000
    entries, so its only seals are the opening and the close record."""
    d = tmp_path_factory.mktemp("faults")
    path = d / "audit.db"
    fill(path, 400, key=KEY, every=10_000)
    (d / "op.pub").write_bytes(PUB.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


@pytest.fixture
def log(closed: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "audit.db"
    shutil.copy(closed, dst)
    shutil.copy(closed.parent / "op.pub", tmp_path / "op.pub")
    shutil.copy(closed.parent / "audit.db.lock", tmp_path / "audit.db.lock")  # as a log's directory has it
    return dst


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["audit", "verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _append_forged(db: sqlite3.Connection, n: int = 1) -> None:
    """Correctly chained entries after the last one, as someone with the file but not the key can write."""
    seq, prev = db.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
    body = db.execute("SELECT body FROM entries WHERE seq = 2").fetchone()[0]
    for _ in range(n):
        seq += 1
        forged = body.replace(b"dec-", b"forged-")
        h = digest(prev, seq, forged)
        db.execute(ENTRY_INSERT, (seq, forged, prev, h, *index_row(forged)))
        prev = h


def _rehash_from(db: sqlite3.Connection, seq: int) -> None:
    """Edit entry `seq` and re-chain everything after it (no key: checkpoints untouched)."""
    db.execute("UPDATE entries SET body = CAST(replace(CAST(body AS TEXT), 'acme', 'evil') AS BLOB) WHERE seq = ?", (seq,))
    prev = db.execute("SELECT hash FROM entries WHERE seq = ?", (seq - 1,)).fetchone()[0]
    for s, body in db.execute("SELECT seq, body FROM entries WHERE seq >= ? ORDER BY seq", (seq,)).fetchall():
        h = digest(prev, s, body)
        db.execute(f"UPDATE entries SET prev_hash = ?, hash = ?, {', '.join(f'{c} = ?' for c in ('kind', 'time', 'decision_id', 'tenant'))} "
                   "WHERE seq = ?", (prev, h, *index_row(body)[:4], s))
        prev = h


def test_a_clean_log_is_closed_and_prints_its_anchor(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = verify(log, public_key=PUB, expect_closed=True)
    assert report.ok and report.closed and report.durable_end == N, report.problems
    code, out, _ = cli(capsys, "--log", str(log), "--public-key", str(log.parent / "op.pub"), "--expect-closed")
    assert code == 0 and f"durable log ends at entry {N} (sealed through {N}, closed cleanly)" in out
    anchor = next(line.split()[1] for line in out.splitlines() if line.strip().startswith("anchor:"))
    assert anchor.startswith(f"{N}:") and verify(log, anchor=None).ok
    code, _, _ = cli(capsys, "--log", str(log), "--anchor", anchor)
    assert code == 0


def test_forged_entry_appended_after_the_close_record_is_found(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--log", str(log), "--format", "json")
    (log.parent / "anchor.json").write_text(out)
    with sqlite3.connect(log) as db:
        _append_forged(db, 2)
    for report in (verify(log), verify(log, public_key=PUB)):
        first = report.first_bad
        assert first is not None and (first.seq, first.kind) == (N + 1, ProblemKind.APPENDED), report.problems
    code, out, _ = cli(capsys, "--log", str(log), "--anchor", str(log.parent / "anchor.json"), "--public-key", str(log.parent / "op.pub"))
    assert code == 1 and f"first bad entry {N + 1} (appended)" in out, out


def test_reopening_after_a_close_is_not_an_append(log: Path) -> None:
    anchor = verify(log).last_checkpoint
    with AuditLog.open(log, signing_key=KEY, checkpoint_every=10_000) as w:
        for i in range(5):
            w.append_decision(decision(1000 + i))
    report = verify(log, public_key=PUB, anchor=anchor, expect_closed=True)
    assert report.ok and report.closed and report.durable_end == N + 5, report.problems


def test_rewrite_rehashed_from_entry_150_is_named_at_150(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with sqlite3.connect(log) as db:
        _rehash_from(db, 150)
    report = verify(log, public_key=PUB)
    first = report.first_bad
    assert first is not None and (first.seq, first.kind) == (150, ProblemKind.RESEALED), report.problems
    code, out, _ = cli(capsys, "--log", str(log))
    assert code == 1 and "first bad entry 150 (rewritten)" in out, out


def test_trailing_rows_deleted_with_their_checkpoints(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--log", str(log), "--format", "json")
    anchor_value = json.loads(out)["anchor"]
    with sqlite3.connect(log) as db:
        db.execute("DELETE FROM entries WHERE seq > 400")
        db.execute("DELETE FROM checkpoints WHERE final = 1")  # the close record goes too
    plain = verify(log)
    assert plain.ok and not plain.closed and any("does not end with a close record" in n for n in plain.notes)
    closed = verify(log, expect_closed=True).first_bad
    assert closed is not None and (closed.seq, closed.kind) == (401, ProblemKind.NOT_CLOSED)
    code, out, _ = cli(capsys, "--log", str(log), "--anchor", anchor_value)
    assert code == 1 and "first bad entry 401 (truncated)" in out, out


def _zero_page(path: Path, page: int) -> None:
    with path.open("r+b") as f:
        f.seek(page * PAGE_SIZE)
        f.write(bytes(PAGE_SIZE))


def test_zeroed_page_is_damage_with_where_the_readable_log_ends(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _zero_page(log, 30)
    report = verify(log)
    first = report.first_bad
    assert first is not None and first.kind is ProblemKind.DAMAGED and first.seq == report.durable_end + 1 > 1, report.problems
    code, out, err = cli(capsys, "--log", str(log))
    assert code == 1 and f"DAMAGED: first bad entry {first.seq} (damaged)" in out and "Traceback" not in out + err
    try:  # open re-reads only the unsealed tail: it refuses damage there, cleanly; appends never hide damage elsewhere
        with AuditLog.open(log) as w:
            w.append_decision(decision(9999))
    except AuditLogCorrupt as e:
        assert "damaged" in str(e)
    after = verify(log).first_bad
    assert after is not None and (after.seq, after.kind) == (first.seq, ProblemKind.DAMAGED)


@pytest.mark.parametrize("how", ["header zeroed", "schema page zeroed", "truncated", "emptied"])
def test_unopenable_file_is_reported_damaged(log: Path, capsys: pytest.CaptureFixture[str], how: str) -> None:
    if how == "header zeroed":
        _zero_page(log, 0)
    elif how == "schema page zeroed":
        _zero_page(log, 1)
    else:
        with log.open("r+b") as f:
            f.truncate(log.stat().st_size // 2 if how == "truncated" else 0)
    with pytest.raises(AuditLogDamaged):
        verify(log)
    code, out, err = cli(capsys, "--log", str(log))
    assert code == 1 and err.startswith("policyc audit: damaged:") and len(err.strip().splitlines()) == 1 and not out, err


def test_serve_refuses_a_damaged_log_in_one_line(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _zero_page(log, 0)  # (damage inside the sealed entries is `verify`'s to find: open re-reads only the unsealed tail)
    code = main(["serve", "--bundle", str(tmp_path / "missing-bundle.json"), "--audit-log", str(log)])
    assert code == 2  # the bundle is checked first
    from policyc.compiler import bundle_io
    from policyc.compiler.pipeline import compile_paths

    bundle = compile_paths([str(Path(__file__).resolve().parents[2] / "policies")], analyse=False).bundle
    assert bundle is not None
    bundle_io.write(bundle, tmp_path / "bundle.json")
    capsys.readouterr()
    code = main(["serve", "--bundle", str(tmp_path / "bundle.json"), "--audit-log", str(log), "--port", "0", "--enforcer", "off"])
    _, err = capsys.readouterr()
    assert code == 2 and "damaged" in err and "Traceback" not in err, err
    (tmp_path / "bad.key").write_text("not a key\n")
    code = main(["serve", "--bundle", str(tmp_path / "bundle.json"), "--audit-log", str(tmp_path / "a.db"), "--audit-key", str(tmp_path / "bad.key")])
    _, err = capsys.readouterr()
    assert code == 2 and "not an ed25519 private key" in err, err


@pytest.mark.parametrize(("where", "says"), [("missing/audit.db", "does not exist"), ("a-directory", "not a regular file"),
                                             ("/dev/null", "not a regular file"), ("not-a-log.txt", "not an audit log")])
def test_unusable_audit_paths_are_refused_in_one_line(tmp_path: Path, where: str, says: str) -> None:
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "not-a-log.txt").write_text("hello\n" * 100)
    from policyc.audit.errors import AuditLogUnavailable

    with pytest.raises(AuditLogUnavailable, match=says):
        AuditLog.open(tmp_path / where if not where.startswith("/") else where)
