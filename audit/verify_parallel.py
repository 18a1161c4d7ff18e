"""The whole log's walk, split across processes when the log is large.

Each entry's checks need only its own row and the hash of the entry before it: its hash
covers its predecessor's hash, its seq and its body, and its index columns come from its
body. So the seq range [first, end] splits into chunks [lo_i, hi_i] (lo_0 = first,
lo_{i+1} = hi_i + 1, hi_last = end) that separate processes walk at once, chunk i starting
from S_i: the segment's genesis for i = 0, else the hash stored in row lo_i - 1, read by
the lead. The lead then stitches the chunks in order.

Why the stitched answer is the sequential walk's (`walk` over all rows from `genesis`):

`walk` is a deterministic fold: its state before a row is (expected seq, previous hash),
it stops at the first row that fails, and what it reports depends only on that state and
the rows it reads. The parallel path is taken only when `seq` is the table's INTEGER
PRIMARY KEY (unique, so SQLite returns one row per seq in seq order) and min, max and
count say the stored seqs are exactly first..end; so the rows the sequential walk reads
after entry lo_i - 1 are exactly chunk i's rows, in the same order.

Claim: if chunks 0..i-1 each ended without a problem at their last seq hi_j, and each
one's computed last hash L_j equals S_{j+1} (the boundary check), then the sequential walk
reaches row lo_i in state (lo_i, S_i), the state chunk i starts from, so it reads what
chunk i read and finds what chunk i found. Induction on i: for i = 0 both start at (first,
genesis). Step: the sequential walk enters chunk i-1 in its start state (induction), so it
computes exactly what chunk i-1 computed and leaves it in state (hi_{i-1} + 1, L_{i-1}) =
(lo_i, S_i) by the boundary check.

So the stitch adds chunks in order while each ends cleanly at its hi and matches the next
start; at the first chunk that reports a problem, the sequential walk reports the same one
(claim), and later chunks are dropped as it would never read them. At a boundary the stitch
cannot vouch for (a chunk that ended early, or whose last hash is not the hash the next
chunk started from, e.g. the file changed between the lead's read and a worker's), it walks
on sequentially from the last entry that checked out, so the answer is still the sequential
walk's. Every entry is hashed and linked once by some process; no stored hash is trusted
that is not also the recomputed hash of the entry before it: a clean stitched walk is a
proof of the whole chain from genesis to `end`, as strong as the sequential one.

A million entries cost ~7 µs each of CPU (SQLite's row, the hash, the index columns);
auditors' machines have cores to spare.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import subprocess
import sys

from .store import connect_reader
from .verify_chain import WalkResult, walk

PARALLEL_FROM = 50_000  # entries; below this, starting processes (~0.1 s each) costs more than it saves
MAX_WORKERS = 8


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container or `taskset` may
    narrow below `os.cpu_count()`)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _walk_chunk(path: str, select: str, lo: int, hi: int, prev: bytes, collect: frozenset[int], indexed: bool) -> WalkResult:
    conn = connect_reader(path)
    try:
        return walk(conn.execute(select + " WHERE seq BETWEEN ? AND ? ORDER BY seq", (lo, hi)), prev, lo, collect, indexed=indexed)
    finally:
        conn.close()


def _seq_is_rowid(conn: sqlite3.Connection) -> bool:
    """Whether `entries.seq` is the table's INTEGER PRIMARY KEY (so unique): a redefined
    table could hold duplicate seqs, whose order SQLite does not fix; such a log is walked
    in one process."""
    cols = conn.execute("PRAGMA table_info(entries)").fetchall()  # (cid, name, type, notnull, default, pk)
    pks = [c for c in cols if c[5]]
    return len(pks) == 1 and pks[0][1] == "seq" and str(pks[0][2]).upper() == "INTEGER"


def _stored_hash(conn: sqlite3.Connection, seq: int) -> bytes | None:
    row = conn.execute("SELECT hash FROM entries WHERE seq = ?", (seq,)).fetchone()
    return row[0] if row is not None and isinstance(row[0], bytes) else None


def plan(first: int, count: int, k: int) -> list[tuple[int, int]]:
    """The chunks [lo, hi] of `count` entries from seq `first`, for `k` processes."""
    size = -(-count // k)
    end = first + count - 1
    bounds = [(first + i * size, min(end, first - 1 + (i + 1) * size)) for i in range(k)]
    return [(lo, hi) for lo, hi in bounds if lo <= hi]


def walk_log(path: str, conn: sqlite3.Connection, select: str, genesis: bytes, collect: frozenset[int], *, indexed: bool,
             workers: int | None = None, first: int = 1) -> WalkResult:
    """`walk` over every entry of the log file at `path` (`conn`: an open reader of it), in
    `workers` processes (default: the usable CPUs, at most MAX_WORKERS) when it is large.
    `genesis` is the hash entry `first` links to (a segment's base, `segments.py`). The
    answer is the one-process walk's (proof in the module's docstring)."""
    lo_seq, hi_seq, count = conn.execute("SELECT min(seq), max(seq), count(*) FROM entries").fetchone()
    k = min(workers or usable_cpus(), MAX_WORKERS)
    serial = k < 2 or count < PARALLEL_FROM or lo_seq != first or hi_seq != first + count - 1  # small, or seqs not consecutive
    bounds = plan(first, count, k) if not serial and _seq_is_rowid(conn) else []
    found = [_stored_hash(conn, lo - 1) for lo, _ in bounds[1:]]
    starts = [genesis, *(s for s in found if s is not None)]
    if len(bounds) < 2 or len(starts) != len(bounds):  # one chunk, or a start the file no longer holds
        return walk(conn.execute(select + " ORDER BY seq"), genesis, first, collect, indexed=indexed)
    # Plain child processes (`python -m`), not multiprocessing: no re-import of the caller's
    # main module, and safe from a threaded caller (the gRPC auditor API).
    procs = []
    for (lo, hi), prev in zip(bounds[1:], starts[1:]):
        proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps((path, select, lo, hi, prev, collect, indexed)))
        proc.stdin.close()
        procs.append(proc)
    head = _walk_chunk(path, select, *bounds[0], genesis, collect, indexed)
    rest = []
    for proc, (lo, hi), prev in zip(procs, bounds[1:], starts[1:]):
        assert proc.stdout is not None
        out = proc.stdout.read()
        if proc.wait() != 0:  # a worker that failed: walk its chunk here instead
            rest.append(_walk_chunk(path, select, lo, hi, prev, collect, indexed))
        else:
            rest.append(pickle.loads(out))
    return stitch(conn, select, collect, indexed, bounds, starts, [head, *rest])


def stitch(conn: sqlite3.Connection, select: str, collect: frozenset[int], indexed: bool,
           bounds: list[tuple[int, int]], starts: list[bytes], chunks: list[WalkResult]) -> WalkResult:
    """The chunks' results joined in order into the sequential walk's (module docstring):
    each boundary is taken only when the chunk before it ended cleanly at its last seq with
    the hash the next chunk started from; otherwise the walk goes on here, one entry at a
    time, from the last entry that checked out."""
    total = WalkResult(0, b"", 0)
    for i, ((_lo, hi), r) in enumerate(zip(bounds, chunks)):
        total.count += r.count
        total.hashes_at.update(r.hashes_at)
        if total.index_problem is None:
            total.index_problem = r.index_problem
        total.last_seq, total.last_hash, total.problem = r.last_seq, r.last_hash, r.problem
        if r.problem is not None:
            return total
        if r.last_seq != hi or (i + 1 < len(bounds) and r.last_hash != starts[i + 1]):
            # entries missing at the chunk's end, or the next chunk started from another hash:
            # walk on from the last entry that checked out
            more = walk(conn.execute(select + " WHERE seq > ? ORDER BY seq", (r.last_seq,)), r.last_hash, r.last_seq + 1, collect, indexed=indexed)
            total.count += more.count
            total.hashes_at.update(more.hashes_at)
            if total.index_problem is None:
                total.index_problem = more.index_problem
            total.last_seq, total.last_hash, total.problem = more.last_seq, more.last_hash, more.problem
            return total
    return total


def _main() -> None:
    """A worker: walk the chunk described on stdin, the result on stdout (both pickled,
    between two processes of this same policyc)."""
    args = pickle.loads(sys.stdin.buffer.read())
    sys.stdout.buffer.write(pickle.dumps(_walk_chunk(*args)))


if __name__ == "__main__":
    _main()
