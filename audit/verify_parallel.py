"""The whole log's walk, split across processes when the log is large.

Each entry's checks need only its own row and the stored hash of the entry before it: its
hash covers its predecessor's hash, its seq and its body, and its index columns come from
its body. So the seq range splits into chunks that separate processes walk at once, each
starting from the stored hash just before its chunk; stitched in order, they give the
sequential walk's answer. A chunk boundary the stitching cannot vouch for (entries missing
at the end of a chunk, a chunk that stopped at a problem) is re-walked sequentially from the
last entry that checked out, so an altered log gets exactly the sequential diagnosis. A
million entries take ~15 µs each in one process (hash, index columns, SQLite's row);
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


def _walk_chunk(path: str, select: str, lo: int, hi: int, prev: bytes, collect: frozenset[int], indexed: bool) -> WalkResult:
    conn = connect_reader(path)
    try:
        return walk(conn.execute(select + " WHERE seq BETWEEN ? AND ? ORDER BY seq", (lo, hi)), prev, lo, collect, indexed=indexed)
    finally:
        conn.close()


def walk_log(path: str, conn: sqlite3.Connection, select: str, genesis: bytes, collect: frozenset[int], *, indexed: bool,
             workers: int | None = None, first: int = 1) -> WalkResult:
    """`walk` over every entry of the log file at `path` (`conn`: an open reader of it), in
    `workers` processes (default: the CPUs, at most MAX_WORKERS) when it is large. `genesis`
    is the hash entry `first` links to (a segment's base, `segments.py`)."""
    lo_seq, hi_seq, count = conn.execute("SELECT min(seq), max(seq), count(*) FROM entries").fetchone()
    k = min(workers or os.cpu_count() or 1, MAX_WORKERS)
    if k < 2 or count < PARALLEL_FROM or lo_seq != first or hi_seq != first + count - 1:  # small, or seqs not consecutive: one walk
        return walk(conn.execute(select + " ORDER BY seq"), genesis, first, collect, indexed=indexed)
    size = -(-count // k)
    end = first + count - 1
    bounds = [(first + i * size, min(end, first - 1 + (i + 1) * size)) for i in range(k)]
    bounds = [(lo, hi) for lo, hi in bounds if lo <= hi]
    starts = [genesis] + [conn.execute("SELECT hash FROM entries WHERE seq = ?", (lo - 1,)).fetchone()[0] for lo, _ in bounds[1:]]
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
    return _stitch(conn, select, collect, indexed, bounds, [head, *rest])


def _stitch(conn: sqlite3.Connection, select: str, collect: frozenset[int], indexed: bool,
            bounds: list[tuple[int, int]], chunks: list[WalkResult]) -> WalkResult:
    total = WalkResult(0, b"", 0)
    for (_lo, hi), r in zip(bounds, chunks):
        total.count += r.count
        total.hashes_at.update(r.hashes_at)
        if total.index_problem is None:
            total.index_problem = r.index_problem
        total.last_seq, total.last_hash, total.problem = r.last_seq, r.last_hash, r.problem
        if r.problem is not None:
            return total
        if r.last_seq != hi:  # entries missing at the chunk's end: walk on from here, one entry at a time
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
