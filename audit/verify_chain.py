"""The inner loop of verification: walk stored entries in seq order and re-hash each.

Kept apart from the diagnosis (`verify.py`) because it is the hot path of `verify` over a
million entries and of the tail check on open, and because it must stay a plain loop that
stops at the first entry that does not check out.
"""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Sequence

from .chain import COLUMNS
from .index_columns import index_row

_pack_seq = struct.Struct(">Q").pack
_sha = hashlib.sha256


class Break(str, Enum):
    """How the walk found an entry wrong (before any diagnosis)."""

    GAP = "gap"  # the next stored seq is not the expected one
    HASH = "hash"  # the entry does not hash to its stored hash
    LINK = "link"  # the entry hashes, but does not link to the entry before it
    DAMAGED = "damaged"  # the file cannot be read from here on (SQLite reports it malformed)


@dataclass(frozen=True, slots=True)
class WalkProblem:
    seq: int  # the expected seq where the walk stopped
    found_seq: int  # the stored seq of the entry it stopped at
    kind: Break
    message: str


@dataclass(slots=True)
class WalkResult:
    last_seq: int
    last_hash: bytes
    count: int
    problem: WalkProblem | None = None
    hashes_at: dict[int, bytes] = field(default_factory=dict)
    index_problem: tuple[int, str] | None = None  # (seq, column or "body"): the first entry whose index columns disagree


def walk(rows: Iterable[Sequence[object]], prev: bytes, expect: int, collect: frozenset[int] = frozenset(), *, indexed: bool = False) -> WalkResult:
    """Check rows `(seq, body, prev_hash, hash)` (`store.CHAIN_SELECT`) against the chain starting with
    `prev` at seq `expect`. Collects the hash of every seq in `collect` (checkpoint seqs).

    `indexed` (store v2): rows also carry the index columns (`store.INDEXED_CHAIN_SELECT`),
    and each entry's are re-derived from its body; the first that disagrees is kept in
    `index_problem` and the walk goes on (a chain break found later is still the chain's)."""
    result = WalkResult(expect - 1, prev, 0)
    try:
        _walk_rows(rows, result, prev, expect, collect, indexed)
    except sqlite3.DatabaseError as e:  # a zeroed or truncated page: the file ends here for us
        result.problem = WalkProblem(result.last_seq + 1, result.last_seq + 1, Break.DAMAGED, f"the file is damaged (SQLite: {e})")
    return result


def _walk_rows(rows: Iterable[Sequence[object]], result: WalkResult, prev: bytes, expect: int, collect: frozenset[int],
               indexed: bool) -> None:
    """The loop of `walk`; keeps `result` current after every entry, so that a read error
    leaves it at the last entry that checked out."""
    hashes_at = result.hashes_at
    count = 0
    for row in rows:
        seq = row[0]
        if seq != expect:
            result.problem = WalkProblem(expect, seq, Break.GAP, f"expected entry {expect}, found {seq}")  # type: ignore[arg-type]
            break
        body, p, h = row[1], row[2], row[3]
        try:
            computed = _sha(p + _pack_seq(seq) + body).digest()  # type: ignore[operator]
        except TypeError:
            computed = b""
        if computed != h:
            result.problem = WalkProblem(expect, seq, Break.HASH, "its content does not match its hash")  # type: ignore[arg-type]
            break
        if p != prev:
            result.problem = WalkProblem(expect, seq, Break.LINK, "it does not link to the entry before it")  # type: ignore[arg-type]
            break
        if indexed:  # until the first disagreement (then `_index_disagrees` names the column)
            try:
                agrees = index_row(body) == row[4:]  # type: ignore[arg-type]
            except ValueError:
                agrees = False
            if not agrees:
                result.index_problem, indexed = _index_disagrees(row), False
        if seq in collect:
            hashes_at[seq] = h  # type: ignore[assignment]
        prev = h  # type: ignore[assignment]
        expect += 1
        count += 1
        result.last_seq, result.last_hash, result.count = seq, prev, count  # type: ignore[assignment]


def _index_disagrees(row: Sequence[object]) -> tuple[int, str] | None:
    """(seq, the first column that disagrees with the body, or "body" when it is not JSON)."""
    try:
        want = index_row(row[1])  # type: ignore[arg-type]
    except ValueError:
        return (row[0], "body")  # type: ignore[return-value]
    have = tuple(row[4:])
    if want == have:
        return None
    return (row[0], next(c for c, w, h in zip(COLUMNS, want, have) if w != h))  # type: ignore[return-value]
