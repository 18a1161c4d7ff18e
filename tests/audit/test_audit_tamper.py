"""Each kind of tampering is detected, and `verify` names the first bad entry and the kind.

The attacker here has full write access to the database file but not the signing key.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Callable

import pytest
from audit_helpers import fill
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.audit import checkpoints
from policyc.audit.chain import COLUMNS, digest
from policyc.audit.errors import AuditLogCorrupt
from policyc.audit.index_columns import index_row
from policyc.audit.log import AuditLog
from policyc.audit.store import ENTRIES_DDL_V1, ENTRY_INSERT, ENTRY_SELECT, STORE_V1
from policyc.audit.verify import ProblemKind, verify

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
N_ENTRIES = 220  # 200 decisions + 20 actions
_N = len(COLUMNS)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "audit.db"
    fill(path, 200, key=KEY)
    return path


@pytest.fixture
def log(pristine: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "audit.db"
    shutil.copy(pristine, dst)
    return dst


def _rows(db: sqlite3.Connection, where: str = "", args: tuple = ()) -> list[list]:
    return [list(r) for r in db.execute(ENTRY_SELECT + f" {where} ORDER BY seq", args)]


def _rehash_from(db: sqlite3.Connection, seq: int) -> None:
    """What an attacker without the key does to hide an edit: recompute every hash from `seq` on."""
    prev_row = db.execute("SELECT hash FROM entries WHERE seq < ? ORDER BY seq DESC LIMIT 1", (seq,)).fetchone()
    prev = prev_row[0]
    for r in _rows(db, "WHERE seq >= ?", (seq,)):
        h = digest(prev, r[0], r[_N + 1])
        db.execute("UPDATE entries SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, h, r[0]))
        prev = h


def _edit_body(db: sqlite3.Connection) -> None:
    db.execute("UPDATE entries SET body = CAST(replace(CAST(body AS TEXT), '\"outcome\":\"rejected\"', '\"outcome\":\"admitted\"') AS BLOB) WHERE seq = 61")


def _edit_column(db: sqlite3.Connection) -> None:
    """Store v2's index columns are plain: the body (hashed) stays their only source."""
    db.execute("UPDATE entries SET gpu_s = gpu_s / 10 WHERE seq = 61")


def _edit_text_column(db: sqlite3.Connection) -> None:
    db.execute("UPDATE entries SET tenant = tenant || '-renamed' WHERE seq = 61")


def _drop_column(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE entries DROP COLUMN net_src")


def _reindex(db: sqlite3.Connection, seq: int) -> None:
    """What a careful attacker does after editing a body: make the index columns agree."""
    body = db.execute("SELECT body FROM entries WHERE seq = ?", (seq,)).fetchone()[0]
    db.execute(f"UPDATE entries SET {', '.join(f'{c} = ?' for c in COLUMNS)} WHERE seq = ?", (*index_row(body), seq))


def _edit_and_rehash_one(db: sqlite3.Connection) -> None:
    _edit_body(db)
    _reindex(db, 61)
    r = _rows(db, "WHERE seq = 61")[0]
    db.execute("UPDATE entries SET hash = ? WHERE seq = 61", (digest(r[_N + 2], 61, r[_N + 1]),))


def _edit_and_rehash_rest(db: sqlite3.Connection) -> None:
    _edit_body(db)
    _reindex(db, 61)
    _rehash_from(db, 61)


def _edit_rehash_and_resign_with_own_key(db: sqlite3.Connection) -> None:
    _edit_and_rehash_rest(db)
    forger = Ed25519PrivateKey.generate()
    lid = db.execute("SELECT value FROM meta WHERE key = 'log_id'").fetchone()[0]
    for cid, seq, t, final, opens, kept in db.execute("SELECT id, seq, time, final, opens, sealed FROM checkpoints").fetchall():
        h = db.execute("SELECT hash FROM entries WHERE seq = ?", (seq,)).fetchone()[0]
        n = len(kept) // 32  # the hashes each checkpoint keeps, rewritten as well
        kept = b"".join(r[0] for r in db.execute("SELECT hash FROM entries WHERE seq > ? AND seq <= ? ORDER BY seq", (seq - n, seq)))
        pub, sig = checkpoints.sign(forger, lid, seq, h.hex(), t, bool(final), bool(opens), kept)
        db.execute("UPDATE checkpoints SET hash = ?, public_key = ?, signature = ?, sealed = ? WHERE id = ?", (h, pub, sig, kept, cid))


def _delete(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM entries WHERE seq IN (61, 62)")


def _delete_and_renumber(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM entries WHERE seq = 61")
    for (seq,) in db.execute("SELECT seq FROM entries WHERE seq > 61 ORDER BY seq").fetchall():
        db.execute("UPDATE entries SET seq = ? WHERE seq = ?", (seq - 1, seq))


def _reorder(db: sqlite3.Connection) -> None:
    db.execute("UPDATE entries SET seq = -1 WHERE seq = 61")
    db.execute("UPDATE entries SET seq = 61 WHERE seq = 62")
    db.execute("UPDATE entries SET seq = 62 WHERE seq = -1")


def _insert(db: sqlite3.Connection, *, consistent: bool) -> None:
    """Shift entries >= 61 up by one and put a forged decision at 61."""
    for (seq,) in db.execute("SELECT seq FROM entries WHERE seq >= 61 ORDER BY seq DESC").fetchall():
        db.execute("UPDATE entries SET seq = ? WHERE seq = ?", (seq + 1, seq))
    forged = _rows(db, "WHERE seq = 62")[0]
    forged[0] = 61
    forged[_N + 1] = forged[_N + 1].replace(b"dec-", b"forged-")
    prev = db.execute("SELECT hash FROM entries WHERE seq = 60").fetchone()[0]
    forged[_N + 2] = prev
    forged[_N + 3] = digest(prev, 61, forged[_N + 1]) if consistent else bytes(32)
    db.execute(ENTRY_INSERT, (forged[0], forged[_N + 1], forged[_N + 2], forged[_N + 3], *index_row(forged[_N + 1])))


def _truncate(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM entries WHERE seq > 210")


def _forge_signature(db: sqlite3.Connection) -> None:
    db.execute("UPDATE checkpoints SET signature = ? WHERE id = (SELECT min(id) FROM checkpoints WHERE seq = 100)", ("00" * 64,))


CASES: list[tuple[str, Callable[[sqlite3.Connection], None], int, ProblemKind]] = [
    ("edited body", _edit_body, 61, ProblemKind.EDITED),
    ("edited index column", _edit_column, 61, ProblemKind.EDITED),
    ("edited text index column", _edit_text_column, 61, ProblemKind.EDITED),
    ("dropped index column", _drop_column, 1, ProblemKind.EDITED),
    ("edited and re-hashed", _edit_and_rehash_one, 61, ProblemKind.EDITED),
    ("deleted", _delete, 61, ProblemKind.DELETED),
    ("deleted and renumbered", _delete_and_renumber, 61, ProblemKind.DELETED),
    ("reordered", _reorder, 61, ProblemKind.REORDERED),
    ("inserted (consistent hash)", lambda db: _insert(db, consistent=True), 61, ProblemKind.INSERTED),
    ("inserted (bad hash)", lambda db: _insert(db, consistent=False), 61, ProblemKind.INSERTED),
    ("truncated", _truncate, 211, ProblemKind.TRUNCATED),
    ("forged checkpoint signature", _forge_signature, 100, ProblemKind.BAD_SIGNATURE),
]


def test_untouched_log_verifies(log: Path) -> None:
    report = verify(log, public_key=KEY.public_key())
    assert report.ok, report.problems
    assert report.entries == N_ENTRIES and report.sealed_seq == N_ENTRIES
    assert report.checkpoints >= 5


@pytest.mark.parametrize(("name", "tamper", "seq", "kind"), CASES, ids=[c[0] for c in CASES])
def test_tampering_is_detected_and_named(log: Path, name: str, tamper: Callable[[sqlite3.Connection], None], seq: int, kind: ProblemKind) -> None:
    with sqlite3.connect(log) as db:
        tamper(db)
    report = verify(log, public_key=KEY.public_key())
    assert not report.ok
    first = report.first_bad
    assert first is not None
    assert (first.seq, first.kind) == (seq, kind), str(first)
    # the hash chain alone (no key) catches it too, except a forged signature
    if kind is not ProblemKind.BAD_SIGNATURE:
        assert not verify(log).ok


def test_rewritten_chain_is_caught_by_checkpoints(log: Path) -> None:
    with sqlite3.connect(log) as db:
        _edit_and_rehash_rest(db)
    first = verify(log).first_bad
    assert first is not None and first.kind is ProblemKind.RESEALED
    assert first.seq <= 61 <= 100  # the altered entry lies between the last good seal and this one


def test_resigning_with_another_key_is_caught(log: Path) -> None:
    with sqlite3.connect(log) as db:
        _edit_rehash_and_resign_with_own_key(db)
    report = verify(log, public_key=KEY.public_key())
    assert {p.kind for p in report.problems} == {ProblemKind.BAD_SIGNATURE}
    assert verify(log).ok  # without the operator's key a full rewrite is indistinguishable: that is what keys are for


def test_truncation_that_also_removes_checkpoints_needs_an_anchor(log: Path) -> None:
    anchor = verify(log).last_checkpoint
    assert anchor is not None and anchor.final
    with sqlite3.connect(log) as db:
        db.execute("DELETE FROM entries WHERE seq > 180")
        db.execute("DELETE FROM checkpoints WHERE seq > 180")
    plain = verify(log)
    assert plain.ok and plain.verdict == "amber"  # the file alone (no head copied) cannot show it: amber, never green
    assert any("151..180" in n and "not yet sealed" in n for n in plain.notes), plain.notes
    anchored = verify(log, anchor=anchor)
    first = anchored.first_bad
    assert first is not None and (first.seq, first.kind) == (181, ProblemKind.TRUNCATED)


def test_wrong_public_key_fails(log: Path) -> None:
    report = verify(log, public_key=Ed25519PrivateKey.generate().public_key())
    assert {p.kind for p in report.problems} == {ProblemKind.BAD_SIGNATURE}


def test_edited_index_column_is_named_with_its_column(log: Path) -> None:
    with sqlite3.connect(log) as db:
        db.execute("UPDATE entries SET region = 'nowhere' WHERE seq = 130")
        db.execute("UPDATE entries SET gpu_s = 0 WHERE seq = 170")
    first = verify(log).first_bad
    assert first is not None and (first.seq, first.kind) == (130, ProblemKind.EDITED)
    assert "`region`" in first.message, first.message
    with sqlite3.connect(log) as db:
        db.execute("DELETE FROM checkpoints WHERE seq >= 130")  # entry 130 is now in the unsealed tail
    with pytest.raises(AuditLogCorrupt, match="seq 130 .index column `region`"):  # which open re-checks
        AuditLog.open(log)


def _v1_log(path: Path) -> None:
    """A log as policyc wrote it before store v2: index columns generated by SQLite."""
    with sqlite3.connect(path) as db:
        db.executescript(
            f"""CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            INSERT INTO meta VALUES ('schema', '{STORE_V1}'), ('log_id', 'v1-log');
            {ENTRIES_DDL_V1};
            CREATE INDEX entries_decision ON entries (decision_id) WHERE decision_id IS NOT NULL;
            CREATE INDEX entries_time ON entries (time);
            CREATE TABLE checkpoints (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, hash BLOB NOT NULL, time REAL NOT NULL,
                                      final INTEGER NOT NULL, public_key TEXT, signature TEXT);"""
        )


def test_store_v1_log_is_still_appended_verified_and_its_redefinition_caught(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _v1_log(path)
    fill(path, 30, key=KEY, every=10)
    report = verify(path, public_key=KEY.public_key())
    assert report.ok and report.entries == 33, report.problems
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM entries WHERE tenant IS NOT NULL").fetchone()[0] == 30  # generated by SQLite
        with pytest.raises(sqlite3.OperationalError, match="generated column"):
            db.execute("UPDATE entries SET gpu_s = gpu_s / 10 WHERE seq = 12")
        cols = ", ".join(COLUMNS)  # rebuild the table with plain columns, then edit one
        db.execute("ALTER TABLE entries RENAME TO original")
        db.execute(f"CREATE TABLE entries (seq INTEGER PRIMARY KEY, body BLOB, prev_hash BLOB, hash BLOB, {cols})")
        db.execute(f"INSERT INTO entries SELECT seq, body, prev_hash, hash, {cols} FROM original")
        db.execute("DROP TABLE original")
        db.execute("UPDATE entries SET gpu_s = gpu_s / 10 WHERE seq = 12")
    first = verify(path).first_bad
    assert first is not None and (first.seq, first.kind) == (12, ProblemKind.EDITED), first


@pytest.mark.parametrize(("name", "tamper", "seq", "kind"), [c for c in CASES if c[0] in ("edited body", "edited index column", "deleted", "truncated")],
                         ids=["edited body", "edited index column", "deleted", "truncated"])
def test_parallel_walk_gives_the_sequential_diagnosis(log: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                                      tamper: Callable[[sqlite3.Connection], None], seq: int, kind: ProblemKind) -> None:
    """A large log is walked in chunks by several processes; stitched, they must name the
    same first bad entry as one walk (here every log counts as large)."""
    from policyc.audit import verify_parallel

    monkeypatch.setattr(verify_parallel, "PARALLEL_FROM", 1)
    assert verify(log, public_key=KEY.public_key(), workers=3).ok
    with sqlite3.connect(log) as db:
        tamper(db)
    chunked = verify(log, public_key=KEY.public_key(), workers=3)
    one = verify(log, public_key=KEY.public_key(), workers=1)
    assert [str(p) for p in chunked.problems] == [str(p) for p in one.problems]
    first = chunked.first_bad
    assert first is not None and (first.seq, first.kind) == (seq, kind), str(first)
