"""`verify` split across processes gives the one-process walk's answer, for every tamper.

The chain is walked in chunks, each from the stored hash just before it, and stitched with
a check at every boundary (`audit/verify_parallel.py` has the proof). Here every log counts
as large (PARALLEL_FROM = 1), and each tampered copy is verified both ways: the problems
(the first bad entry named, its kind, the message), the entries, the last seq and hash must
be the same, and the tamper must be found. Cases aim at the chunk boundaries the lead
computes (`plan`): a row just before one, just after one, both swapped, one deleted.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from pathlib import Path
from typing import Callable

import pytest
from audit_helpers import action, decision, fill
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyc.audit import verify_parallel
from policyc.audit.chain import COLUMNS, digest
from policyc.audit.log import AuditLog
from policyc.audit.segments import closed_segments
from policyc.audit.store import ENTRY_SELECT
from policyc.audit.verify import VerifyReport, verify
from policyc.audit.verify_chain import walk

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
WORKERS = 3
_N = len(COLUMNS)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "audit.db"
    fill(path, 100, key=KEY, every=25)  # 110 entries
    return path


@pytest.fixture
def log(pristine: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "audit.db"
    shutil.copy(pristine, dst)
    return dst


@pytest.fixture
def chunked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every log walked in chunks; returns the [lo, hi] of each chunk the lead walked itself
    (the first one, when the parallel path is taken)."""
    monkeypatch.setattr(verify_parallel, "PARALLEL_FROM", 1)
    calls: list[tuple[int, int]] = []
    real = verify_parallel._walk_chunk

    def spy(path: str, select: str, lo: int, hi: int, *rest: object) -> object:
        calls.append((lo, hi))
        return real(path, select, lo, hi, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_parallel, "_walk_chunk", spy)
    return calls


def _count(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM entries").fetchone()[0])


def _row(db: sqlite3.Connection, seq: int) -> list:
    return list(db.execute(ENTRY_SELECT + " WHERE seq = ?", (seq,)).fetchone())


def _edit_body(db: sqlite3.Connection, seq: int) -> None:
    db.execute("UPDATE entries SET body = CAST(replace(CAST(body AS TEXT), 'dec-', 'dex-') AS BLOB) WHERE seq = ?", (seq,))


def _edit_hash(db: sqlite3.Connection, seq: int) -> None:
    db.execute("UPDATE entries SET hash = zeroblob(32) WHERE seq = ?", (seq,))


def _edit_prev(db: sqlite3.Connection, seq: int) -> None:
    db.execute("UPDATE entries SET prev_hash = zeroblob(32) WHERE seq = ?", (seq,))


def _edit_column(db: sqlite3.Connection, seq: int) -> None:
    db.execute("UPDATE entries SET decision_id = 'renamed' WHERE seq = ?", (seq,))


def _delete(db: sqlite3.Connection, seq: int) -> None:
    db.execute("DELETE FROM entries WHERE seq = ?", (seq,))


def _truncate(db: sqlite3.Connection, seq: int) -> None:
    db.execute("DELETE FROM entries WHERE seq >= ?", (seq,))


def _swap_next(db: sqlite3.Connection, seq: int) -> None:
    """Entries `seq` and `seq + 1` change places (each keeps its own hashes)."""
    db.execute("UPDATE entries SET seq = -1 WHERE seq = ?", (seq,))
    db.execute("UPDATE entries SET seq = ? WHERE seq = ?", (seq, seq + 1))
    db.execute("UPDATE entries SET seq = ? WHERE seq = -1", (seq + 1,))


def _edit_rehash_from(db: sqlite3.Connection, seq: int) -> None:
    """An attacker without the key: edit entry `seq`, then re-hash it and every later one
    (the walk passes; the checkpoints' sealed hashes catch it)."""
    _edit_body(db, seq)
    prev = db.execute("SELECT hash FROM entries WHERE seq = ?", (seq - 1,)).fetchone()[0]
    for (s,) in db.execute("SELECT seq FROM entries WHERE seq >= ? ORDER BY seq", (seq,)).fetchall():
        body = _row(db, s)[_N + 1]
        h = digest(prev, s, body)
        db.execute("UPDATE entries SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, h, s))
        prev = h


def _link_next_to_edit(db: sqlite3.Connection, seq: int) -> None:
    """Edit `seq` and re-hash it alone, and make `seq + 1` store the new hash as its
    predecessor: the forged hash is what the next chunk would start from, were `seq` a
    chunk's last entry."""
    _edit_body(db, seq)
    r = _row(db, seq)
    h = digest(r[_N + 2], seq, r[_N + 1])
    db.execute("UPDATE entries SET hash = ? WHERE seq = ?", (h, seq))
    db.execute("UPDATE entries SET prev_hash = ? WHERE seq = ?", (h, seq + 1))


TAMPERS: dict[str, Callable[[sqlite3.Connection, int], None]] = {
    "body edited": _edit_body,
    "stored hash edited": _edit_hash,
    "stored link edited": _edit_prev,
    "index column edited": _edit_column,
    "deleted": _delete,
    "truncated from": _truncate,
    "swapped with the next": _swap_next,
    "edited and re-hashed on": _edit_rehash_from,
    "edited, re-hashed, next relinked": _link_next_to_edit,
}


def _same(a: VerifyReport, b: VerifyReport) -> None:
    assert [str(p) for p in a.problems] == [str(p) for p in b.problems]
    assert (a.first_bad, a.entries, a.last_seq, a.last_hash, a.durable_end) == (b.first_bad, b.entries, b.last_seq, b.last_hash, b.durable_end)


def _both(log: Path, workers: int = WORKERS) -> tuple[VerifyReport, VerifyReport]:
    return verify(log, public_key=KEY.public_key(), workers=workers), verify(log, public_key=KEY.public_key(), workers=1)


def _where(bounds: list[tuple[int, int]]) -> dict[str, int]:
    """Seqs that matter to the chunking: inside the first and the last chunk, the last entry
    of the second chunk and the first of the third (a boundary)."""
    return {"inside the first chunk": bounds[0][0] + 5, "inside the last chunk": bounds[-1][0] + 5,
            "a chunk's last entry": bounds[1][1], "the next chunk's first entry": bounds[2][0]}


def test_pristine_log_parallel_equals_serial(log: Path, chunked: list[tuple[int, int]]) -> None:
    par, one = _both(log)
    assert par.ok and par.entries == _count(log), par.problems
    _same(par, one)
    assert chunked and chunked[0] == verify_parallel.plan(1, _count(log), WORKERS)[0]  # the lead walked the first chunk only


CASES = [(name, where) for name in TAMPERS for where in ("a chunk's last entry", "the next chunk's first entry")] + [
    ("body edited", "inside the first chunk"), ("body edited", "inside the last chunk"), ("deleted", "inside the last chunk")]


@pytest.mark.parametrize(("name", "where"), CASES, ids=[f"{n} at {w}" for n, w in CASES])
def test_tamper_found_as_the_serial_walk_finds_it(log: Path, chunked: list[tuple[int, int]], name: str, where: str) -> None:
    bounds = verify_parallel.plan(1, _count(log), WORKERS)
    seq = _where(bounds)[where]
    with sqlite3.connect(log) as db:
        TAMPERS[name](db, seq)
    par, one = _both(log)
    _same(par, one)
    assert par.first_bad is not None and not par.ok
    if name in ("body edited", "stored hash edited", "stored link edited", "index column edited", "edited, re-hashed, next relinked"):
        assert par.first_bad.seq in (seq, seq + 1), str(par.first_bad)  # named where it was done (a relinked next: the next)
        assert chunked  # seqs still consecutive: the chunked path ran


def test_a_boundary_whose_start_hash_disagrees_is_walked_on_sequentially(log: Path, chunked: list[tuple[int, int]],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The lead's start for a chunk not the hash the chunk before it computed (the file read
    differently by the lead and a worker): the stitch does not take that boundary but walks
    on from the last entry that checked out, so a pristine log still verifies, fully."""
    real = verify_parallel._stored_hash
    bounds = verify_parallel.plan(1, _count(log), WORKERS)
    monkeypatch.setattr(verify_parallel, "_stored_hash", lambda conn, seq: bytes(32) if seq == bounds[1][1] else real(conn, seq))
    par, one = _both(log)
    assert par.ok, par.problems
    _same(par, one)


def test_stitch_refuses_an_unmatched_boundary() -> None:
    """The stitch itself, on made-up chunks: the first chunk's last hash is not where the
    second started, and the rows (walked again here) say the chain breaks at 3."""
    h1 = digest(b"\0" * 32, 1, b"{}")
    h2 = digest(h1, 2, b"{}")
    rows = [(1, b"{}", b"\0" * 32, h1), (2, b"{}", h1, h2), (3, b"{}", b"\1" * 32, digest(b"\1" * 32, 3, b"{}"))]
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE entries (seq INTEGER PRIMARY KEY, body BLOB, prev_hash BLOB, hash BLOB)")
    db.executemany("INSERT INTO entries VALUES (?, ?, ?, ?)", rows)
    select = "SELECT seq, body, prev_hash, hash FROM entries"
    first = walk(rows[:2], b"\0" * 32, 1)
    second = walk(rows[2:], b"\1" * 32, 3)  # started from a hash that is not entry 2's
    assert first.problem is None and second.problem is None
    got = verify_parallel.stitch(db, select, frozenset(), False, [(1, 2), (3, 3)], [b"\0" * 32, b"\1" * 32], [first, second])
    want = walk(db.execute(select + " ORDER BY seq"), b"\0" * 32, 1)
    assert got.problem is not None and got.problem == want.problem and got.problem.seq == 3
    assert (got.count, got.last_seq, got.last_hash) == (want.count, want.last_seq, want.last_hash) == (2, 2, h2)


_EXAMPLE = itertools.count()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(TAMPERS)), at=st.integers(2, 108), workers=st.integers(2, 5))
def test_any_tamper_anywhere_any_chunking(pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          name: str, at: int, workers: int) -> None:
    monkeypatch.setattr(verify_parallel, "PARALLEL_FROM", 1)
    log = tmp_path / f"h-{next(_EXAMPLE)}.db"  # a fresh file (and no -wal/-shm) per example, repeats included
    shutil.copy(pristine, log)
    with sqlite3.connect(log) as db:
        TAMPERS[name](db, at)
    par, one = _both(log, workers)
    _same(par, one)
    assert not par.ok


def test_rotated_segments_each_walked_in_chunks(tmp_path: Path, chunked: list[tuple[int, int]]) -> None:
    """Three segments, each split into chunks; a tamper at a chunk boundary of the middle
    one is named as the serial walk names it."""
    path = tmp_path / "rot.db"
    with AuditLog.open(path, signing_key=KEY, checkpoint_every=20, durability="normal") as alog:
        for part in range(3):
            rs = [alog.submit_decision(decision(part * 40 + i)) for i in range(40)] + [alog.submit_action(action(part))]
            rs[-1].wait()
            if part < 2:
                alog.rotate()
    par = verify(path, public_key=KEY.public_key(), workers=2)
    assert par.ok and par.segments == 3 and len(chunked) == 3, (par.problems, chunked)  # each segment split
    seg = closed_segments(path)[1][1]
    with sqlite3.connect(seg) as db:
        lo, hi, n = db.execute("SELECT min(seq), max(seq), count(*) FROM entries").fetchone()
        at = verify_parallel.plan(lo, n, 2)[0][1]
        _edit_body(db, at)
    par, one = _both(path, 2)
    _same(par, one)
    assert par.first_bad is not None and par.first_bad.seq == at, str(par.first_bad)
