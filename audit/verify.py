"""`verify`: check a whole log and name the first entry that is wrong, and how.

The walk (`verify_chain.walk`) says *where* the chain stops checking out; this module says
*what happened there* — an entry edited, deleted, inserted, moved, or the tail cut off — by
looking at the entries around the break: every entry's hash covers its seq and its
predecessor's hash, so a moved entry still hashes under its original seq, and an entry
still links to the hash of the one that originally preceded it.

The checkpoints say what the chain alone cannot: a chain rewritten and re-hashed is found
at its first rewritten entry (a checkpoint keeps the hashes it sealed); entries after a
close record (the final checkpoint of a clean stop) with no later signed opening were not
written by policyc; an anchor the operator kept must still be in the log. A file SQLite can
no longer read (a zeroed page, a truncated file) is reported as damaged from the first
entry it cannot read, never as an exception.

The end of the log: deleting the last entries together with the checkpoints that sealed
them, or only the close record, leaves a shorter log that checks out by itself. The sealed
head beside the log (`head.py`) and an anchor kept elsewhere name a checkpoint that must
still be there; without either, the log's end is *unproven*, and the verdict says so: amber,
never green (`VerifyReport.verdict`). A rotated log is walked segment by segment
(`segments.py`), each joint checked, and segments removed by retention are accounted for by
the signed close records kept for them.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .chain import digest, genesis
from .checkpoints import HASH_BYTES, Checkpoint, sealed_digest, signature_valid
from .consistency import first_inconsistent
from .errors import AuditInputError, AuditLogDamaged
from .head import Head, HeadUnreadable, head_path, head_signature_valid, read_head
from .segments import PrunedSegment, closed_segments, pruned
from .store import (CHAIN_SELECT, INDEXED_CHAIN_SELECT, STORE_V1, checkpoint_select, connect_reader, entries_columns_missing,
                    entries_definition_intact, log_id, segment_base, store_schema)
from .verify_chain import Break, WalkProblem
from .verify_parallel import walk_log
from .wal import WalTail, inspect_wal

_SEARCH = 1024  # how far from its position a moved entry is looked for


class ProblemKind(str, Enum):
    EDITED = "edited"
    DELETED = "deleted"
    INSERTED = "inserted"
    REORDERED = "reordered"
    TRUNCATED = "truncated"
    RESEALED = "rewritten"  # consistent chain that no longer matches a checkpoint
    BAD_SIGNATURE = "bad_signature"
    UNSIGNED = "unsigned"
    APPENDED = "appended"  # entries after a close record, with no signed reopening
    SEAL_ALTERED = "checkpoint_altered"  # a checkpoint's kept hashes disagree with the hash it seals
    DAMAGED = "damaged"  # the file cannot be read from this entry on
    NOT_CLOSED = "not_closed"  # the log does not end with its close record (with `expect_closed`)
    CHECKPOINT_DELETED = "checkpoint_deleted"  # a checkpoint the sealed head or the anchor names is gone from the log
    SEGMENT_BROKEN = "segment_broken"  # a segment does not continue the one before it, or a closed one lacks its close record
    HEAD_ALTERED = "head_altered"  # the sealed head beside the log is unreadable, of another log, or not signed by the key


@dataclass(frozen=True, slots=True)
class Problem:
    seq: int
    kind: ProblemKind
    message: str

    def __str__(self) -> str:
        return f"entry {self.seq}: {self.kind.value}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    path: str
    entries: int = 0
    last_seq: int = 0
    last_hash: str = ""
    checkpoints: int = 0
    signatures_checked: bool = False
    sealed_seq: int = 0  # last seq covered by a checkpoint that checked out
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wal: WalTail | None = None
    last_checkpoint: Checkpoint | None = None
    durable_end: int = 0  # the last entry that checks out: where the durable, verifiable log ends
    closed: bool = False  # the log ends with its close record (a final checkpoint at its last entry)
    segments: int = 1  # files walked (closed segments and the live one)
    pruned_through: int = 0  # entries 1..this were in segments removed by retention (proven by their close records)
    proven_end: int = 0  # the log reached at least this entry, by the sealed head or the anchor (0: nothing proves its end)
    head: Head | None = None
    checkpoint_list: list[Checkpoint] = field(default_factory=list)  # every checkpoint of every segment, as stored

    @property
    def ok(self) -> bool:
        """No problem found. Not the same as proven: see `verdict`."""
        return not self.problems

    @property
    def tail_proven(self) -> bool:
        """Something kept apart from the rows (the sealed head, an anchor) shows the log
        reached its last checkpoint: its end was not cut back to an earlier one."""
        return self.proven_end > 0 and self.proven_end >= self.sealed_seq

    @property
    def unproven(self) -> list[str]:
        """Why a log without problems is not fully verified (empty: it is)."""
        why = []
        if not self.signatures_checked:
            why.append("checkpoint signatures were not checked (no public key given): anyone able to edit the file could have re-sealed it")
        if not self.tail_proven:
            if self.proven_end == 0:
                why.append(f"the log's end is unproven: no sealed head ({head_path(self.path).name}) and no anchor shows that it did not "
                           "hold more entries; keep anchors apart from the log (`verify --format json`) and pass one with `--anchor`")
            else:
                why.append(f"the log's end is unproven past entry {self.proven_end}: the sealed head and the anchor name no checkpoint after it, "
                           f"but checkpoints go on to entry {self.sealed_seq} (a crash between a seal and its head, or a head put back)")
        if self.sealed_seq < self.durable_end:
            why.append(f"entries {self.sealed_seq + 1}..{self.durable_end} are not sealed by a checkpoint yet")
        return why

    @property
    def verdict(self) -> Literal["red", "amber", "green"]:
        """red: a problem; amber: no problem, but not everything could be verified
        (`unproven`); green: the chain, every signature and the log's end verified."""
        if self.problems:
            return "red"
        return "amber" if self.unproven else "green"

    @property
    def first_bad(self) -> Problem | None:
        return min(self.problems, key=lambda p: p.seq) if self.problems else None


def _load_checkpoints(conn: sqlite3.Connection) -> tuple[list[Checkpoint], dict[int, bytes]]:
    """The checkpoints in the order written, and the hashes each v2 checkpoint sealed (by id)."""
    out, sealed = [], {}
    for id_, seq, h, t, final, pub, sig, opens, kept in conn.execute(checkpoint_select(conn) + " ORDER BY id"):
        digest_hex = None
        if isinstance(kept, bytes):
            sealed[id_] = kept
            digest_hex = sealed_digest(kept)
        out.append(Checkpoint(id=id_, seq=seq, hash=h.hex() if isinstance(h, bytes) else str(h), time=t, final=bool(final),
                              public_key=pub, signature=sig, opens=bool(opens), sealed_digest=digest_hex))
    return out, sealed


def verify(path: str | os.PathLike[str], *, public_key: Ed25519PublicKey | None = None, anchor: Checkpoint | None = None,
           workers: int | None = None, expect_closed: bool = False) -> VerifyReport:
    """Verify the log at `path`: its closed segments in order, then the live file. With
    `public_key`, every checkpoint (and the sealed head) must carry a valid signature by it.
    `anchor` is a checkpoint the auditor kept from an earlier run (or received from the
    operator): the log must still contain it and reach it, which catches a truncation that
    also removed the later checkpoints and the head. `expect_closed`: the log must end with
    its close record (the service was stopped cleanly). `workers`: processes for a large
    log (default: one per CPU; 1 walks it in this process). Raises AuditLogUnavailable when
    `path` is not an audit log (AuditLogDamaged when it is one SQLite can no longer open)."""
    live = Path(path)
    report = VerifyReport(path=str(path), wal=inspect_wal(str(path)))
    closed = closed_segments(live)
    files = [p for _, p in closed] + ([live] if live.is_file() or not closed else [])
    report.segments = len(files)
    try:
        gone = pruned(live)
    except AuditInputError as e:
        report.problems.append(Problem(1, ProblemKind.SEGMENT_BROKEN, str(e)))
        gone = []
    base: tuple[int, bytes] | None = None
    if gone:
        base = _check_pruned(report, gone, public_key)
    lid: str | None = None
    for i, f in enumerate(files):
        is_live = f == live
        try:
            conn = connect_reader(f)
        except AuditLogDamaged as e:
            if is_live and not closed:
                raise
            report.problems.append(Problem(report.durable_end + 1, ProblemKind.DAMAGED, str(e)))
            break
        part = VerifyReport(path=str(f))
        try:
            seg_lid = log_id(conn)
            if lid is not None and seg_lid != lid:
                report.problems.append(Problem(report.last_seq + 1, ProblemKind.SEGMENT_BROKEN,
                                               f"{f}: belongs to another log (id {seg_lid}, the segments before it {lid})"))
            lid = lid or seg_lid
            _verify(conn, part, public_key, anchor, workers, expect_closed or not is_live, base, f, is_live)
        except sqlite3.DatabaseError as e:  # damage outside the entries' walk (schema, checkpoints, indexes)
            part.problems.append(Problem(part.durable_end + 1, ProblemKind.DAMAGED, f"the file is damaged (SQLite: {e}); "
                                         f"entries up to {part.durable_end} were read and check out" if part.durable_end else
                                         f"the file is damaged (SQLite: {e})"))
        finally:
            conn.close()
        _merge(report, part, i == 0, len(files) > 1 and not is_live)
        base = (part.last_seq, bytes.fromhex(part.last_hash)) if part.last_hash else base
    if gone and public_key is not None and lid is not None:
        for g in gone:
            if not signature_valid(public_key, lid, g.close):
                report.problems.append(Problem(g.close.seq, ProblemKind.BAD_SIGNATURE,
                                               f"the close record kept for pruned segment {g.segment} does not verify with the given public key"))
    _check_end(report, live, lid or "", public_key, anchor, gone)
    if report.wal is not None and report.wal.torn:
        report.notes.append(
            f"the write-ahead log has a torn tail ({report.wal.reason}, {report.wal.torn_bytes} bytes never acknowledged); "
            "it is discarded, and the repair recorded, when the log is next opened for writing"
        )
    return report


def _merge(report: VerifyReport, part: VerifyReport, first: bool, closed_segment: bool) -> None:
    """Add one file's findings to the whole log's report."""
    clean = not report.problems
    report.entries += part.entries
    report.checkpoints += part.checkpoints
    report.signatures_checked = part.signatures_checked
    report.checkpoint_list.extend(part.checkpoint_list)
    report.problems.extend(part.problems)
    where = f"{Path(part.path).name}: " if closed_segment else ""
    report.notes.extend(where + n for n in part.notes if not (closed_segment and n.startswith("the log was closed cleanly")))
    if part.last_hash or first:
        report.last_seq, report.last_hash = part.last_seq, part.last_hash
    if clean:
        report.durable_end = part.durable_end
    if part.sealed_seq >= report.sealed_seq:
        report.sealed_seq = part.sealed_seq
    if part.last_checkpoint is not None:
        report.last_checkpoint = part.last_checkpoint
    report.closed = part.closed


def _check_pruned(report: VerifyReport, gone: list[PrunedSegment], public_key: Ed25519PublicKey | None) -> tuple[int, bytes]:
    """Segments removed by retention: contiguous from entry 1, each proven by its close
    record (signed by the key when one is given). Returns where the kept segments start."""
    expect = 1
    for g in gone:
        if g.first_seq != expect or g.close.seq != g.last_seq or not g.close.final:
            report.problems.append(Problem(expect, ProblemKind.SEGMENT_BROKEN,
                                           f"the record of pruned segment {g.segment} does not continue the one before it "
                                           f"(entries {g.first_seq}..{g.last_seq}, close record at {g.close.seq}; expected to start at {expect})"))
        expect = g.last_seq + 1
    last = gone[-1]
    report.pruned_through = last.last_seq
    report.notes.append(f"entries 1..{last.last_seq} were in segment(s) {gone[0].segment}..{last.segment}, removed by retention; "
                        f"their close record at entry {last.close.seq} ({last.close.seq}:{last.close.hash}) is what proves them")
    return last.close.seq, bytes.fromhex(last.close.hash)


def _verify(conn: sqlite3.Connection, report: VerifyReport, public_key: Ed25519PublicKey | None, anchor: Checkpoint | None,
            workers: int | None, expect_closed: bool, base: tuple[int, bytes] | None = None, where: Path | None = None,
            is_live: bool = True) -> None:
    lid = log_id(conn)
    cps, sealed = _load_checkpoints(conn)
    report.checkpoints = len(cps)
    report.checkpoint_list = list(cps)
    report.signatures_checked = public_key is not None
    number, base_seq, base_hash = segment_base(conn)
    start = base_hash if base_hash is not None else genesis(lid)
    if base is not None and (base[0], base[1]) != (base_seq, start):
        report.problems.append(Problem(base_seq + 1, ProblemKind.SEGMENT_BROKEN,
                                       f"{where}: segment {number} starts after entry {base_seq} ({start.hex()[:16]}...), but the segment "
                                       f"before it ends at entry {base[0]} ({base[1].hex()[:16]}...): segments were removed, replaced or reordered"))
    elif base is None and base_seq != 0:
        report.problems.append(Problem(1, ProblemKind.SEGMENT_BROKEN,
                                       f"{where}: segment {number} continues entry {base_seq}, but no segment before it and no "
                                       f"record of pruned segments is left: entries 1..{base_seq} were removed"))
    want = frozenset([c.seq for c in cps] + ([anchor.seq] if anchor else []))
    v1 = store_schema(conn) == STORE_V1
    missing = [] if v1 else entries_columns_missing(conn)
    report.durable_end = report.last_seq = base_seq
    if missing:  # the columns cannot be checked, so neither can the rest: say so and stop
        report.problems.append(Problem(base_seq + 1, ProblemKind.EDITED, f"the entries table was redefined: it lacks column(s) {', '.join(f'`{c}`' for c in missing)}"))
        return
    select = CHAIN_SELECT if v1 else INDEXED_CHAIN_SELECT
    result = walk_log(report.path, conn, select, start, want, indexed=not v1, workers=workers, first=base_seq + 1)
    if base_seq:
        result.hashes_at.setdefault(base_seq, start)  # the entry this segment follows: its opening seals it again
    report.entries, report.last_seq = result.count, result.last_seq
    report.last_hash = result.last_hash.hex()
    walked_to = report.durable_end = result.last_seq
    complete = result.problem is None
    if result.problem is not None:
        report.problems.append(_diagnose(conn, result.problem, result.last_hash, base_seq))
    else:
        report.entries = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
    if result.index_problem is not None:
        seq, col = result.index_problem
        what = "its body is not a JSON record" if col == "body" else f"its index column `{col}` was changed: it disagrees with the record"
        report.problems.append(Problem(seq, ProblemKind.EDITED, what))
    if v1 and complete and not entries_definition_intact(conn):
        bad = first_inconsistent(conn, 1, walked_to)
        if bad is None:
            report.problems.append(Problem(1, ProblemKind.EDITED, "the entries table was redefined: its index columns are no longer derived from the records"))
        else:
            what = "its body is not a JSON record" if bad[1] == "body" else f"its index column `{bad[1]}` was changed: it disagrees with the record"
            report.problems.append(Problem(bad[0], ProblemKind.EDITED, what + " (the entries table was redefined)"))
    valid = _check_checkpoints(report, conn, cps, sealed, result.hashes_at, walked_to, complete, public_key, lid, base_seq)
    if anchor is not None and base_seq < anchor.seq <= max(walked_to, base_seq) or (anchor is not None and is_live and anchor.seq > walked_to):
        _check_anchor(report, anchor, result.hashes_at, walked_to, complete)
    if complete:
        _check_close(report, valid, anchor if is_live else None, walked_to, expect_closed, is_live)


def _check_end(report: VerifyReport, live: Path, lid: str, public_key: Ed25519PublicKey | None, anchor: Checkpoint | None,
               gone: list[PrunedSegment]) -> None:
    """What proves the log's end: the sealed head beside it and the anchor, each naming a
    checkpoint that must still be in the log as written."""
    cps = report.checkpoint_list
    end = report.last_seq
    complete = not any(p.kind in (ProblemKind.DAMAGED, ProblemKind.DELETED, ProblemKind.EDITED, ProblemKind.INSERTED,
                                  ProblemKind.REORDERED) for p in report.problems)
    if anchor is not None:
        if anchor.seq <= report.pruned_through:
            close = next((g.close for g in gone if g.close.seq == anchor.seq), None)
            if close is not None and close.hash != anchor.hash:
                report.problems.append(Problem(anchor.seq, ProblemKind.RESEALED, f"the anchor's entry {anchor.seq} does not have the hash "
                                               "the pruned segment's close record keeps"))
            elif close is None:
                report.notes.append(f"the anchor (entry {anchor.seq}) lies in a segment removed by retention; "
                                    f"the pruned record proves the chain through entry {report.pruned_through}")
        elif anchor.seq <= end and not _holds(cps, anchor):
            what = "the close record" if anchor.final else "a checkpoint" if anchor.time else "the checkpoint"
            report.problems.append(Problem(anchor.seq, ProblemKind.CHECKPOINT_DELETED,
                                           f"the anchor names {what} at entry {anchor.seq}" + (f" (written {anchor.time!r})" if anchor.time else "")
                                           + ", which is no longer in the log: it was deleted"))
        elif anchor.seq <= end:
            report.proven_end = max(report.proven_end, anchor.seq)
    try:
        head = read_head(live)
    except HeadUnreadable as e:
        report.problems.append(Problem(end + 1, ProblemKind.HEAD_ALTERED, str(e)))
        return
    report.head = head
    if head is None:
        return
    where = head_path(live).name
    if lid and head.log_id != lid:
        report.problems.append(Problem(end + 1, ProblemKind.HEAD_ALTERED, f"{where} belongs to another log (id {head.log_id}, this one {lid})"))
        return
    if public_key is not None and not head_signature_valid(public_key, head):
        report.problems.append(Problem(head.seq, ProblemKind.HEAD_ALTERED, f"{where} is not signed by the given public key (forged or altered head)"))
        return
    what = "its close record" if head.final else "a segment's opening" if head.opens else "a checkpoint"
    if head.seq > end:
        if complete:
            report.problems.append(Problem(end + 1, ProblemKind.TRUNCATED,
                                           f"the log ends at entry {end}, but its sealed head ({where}) names {what} at entry {head.seq}: "
                                           f"entries {end + 1}..{head.seq} were removed together with their checkpoints"))
        return
    if head.seq <= report.pruned_through:
        report.notes.append(f"the sealed head names entry {head.seq}, in a segment removed by retention")
        return
    match = [c for c in cps if c.seq == head.seq and c.time == head.time]
    if not match:
        report.problems.append(Problem(head.seq, ProblemKind.CHECKPOINT_DELETED,
                                       f"the sealed head ({where}) names {what} at entry {head.seq}, written {head.time!r}, which is no "
                                       "longer in the log: it was deleted"))
    elif match[0].hash != head.hash:
        report.problems.append(Problem(head.seq, ProblemKind.SEAL_ALTERED,
                                       f"the checkpoint at entry {head.seq} does not seal the hash the sealed head ({where}) names"))
    else:
        report.proven_end = max(report.proven_end, head.seq)


def _holds(cps: list[Checkpoint], anchor: Checkpoint) -> bool:
    """The log still holds the anchor's checkpoint (a `SEQ:HASH` anchor: a checkpoint at
    that entry with that hash; a whole one: that checkpoint, written at that time)."""
    for c in cps:
        if c.seq == anchor.seq and c.hash == anchor.hash and (not anchor.time or (c.time == anchor.time and c.final == anchor.final)):
            return True
    return False


def _check_checkpoints(
    report: VerifyReport,
    conn: sqlite3.Connection,
    cps: list[Checkpoint],
    sealed: dict[int, bytes],
    hashes_at: dict[int, bytes],
    walked_to: int,
    complete: bool,
    public_key: Ed25519PublicKey | None,
    lid: str,
    base_seq: int = 0,
) -> list[Checkpoint]:
    """Check each checkpoint against the chain; returns those that are authentic (signed by
    `public_key` when one is given) and still match it."""
    prev_ok = base_seq
    valid: list[Checkpoint] = []
    rewritten = 0
    for cp in cps:
        if public_key is not None:
            if cp.signature is None:
                report.problems.append(Problem(cp.seq, ProblemKind.UNSIGNED, f"checkpoint #{cp.id} is not signed, but a public key was given"))
                continue
            if not signature_valid(public_key, lid, cp):
                report.problems.append(Problem(cp.seq, ProblemKind.BAD_SIGNATURE, f"checkpoint #{cp.id} does not verify with the given public key (forged or altered seal)"))
                continue
        kept = sealed.get(cp.id)
        if kept is not None and (len(kept) % HASH_BYTES or (kept and kept[-HASH_BYTES:].hex() != cp.hash)):
            report.problems.append(Problem(cp.seq, ProblemKind.SEAL_ALTERED,
                                           f"checkpoint #{cp.id} was altered or its pages damaged: the entry hashes it keeps do not end with the hash it seals"))
            continue
        if cp.seq > walked_to:
            if complete:
                report.problems.append(
                    Problem(walked_to + 1, ProblemKind.TRUNCATED, f"the log ends at entry {walked_to}, but checkpoint #{cp.id} sealed entries up to {cp.seq}: entries {walked_to + 1}..{cp.seq} were removed")
                )
            continue
        h = hashes_at.get(cp.seq)
        if h is None or h.hex() != cp.hash:
            if not rewritten:
                report.problems.append(_rewritten(conn, cp, kept, prev_ok))
            rewritten += 1
            continue
        valid.append(cp)
        prev_ok = max(prev_ok, cp.seq)
        report.sealed_seq = max(report.sealed_seq, cp.seq)
        report.last_checkpoint = cp
    if rewritten > 1:
        report.notes.append(f"{rewritten - 1} later checkpoint(s) no longer match the chain either")
    if public_key is None and cps:
        report.notes.append("checkpoint signatures were not checked (no public key given)")
    if not cps:
        report.notes.append("the log has no checkpoint: truncation of its tail cannot be detected")
    elif complete and report.sealed_seq < walked_to:
        report.notes.append(f"entries {report.sealed_seq + 1}..{walked_to} are not yet sealed by a checkpoint")
    return valid


def _rewritten(conn: sqlite3.Connection, cp: Checkpoint, kept: bytes | None, prev_ok: int) -> Problem:
    """A checkpoint whose entry no longer has the hash it sealed: the chain was re-hashed.
    The hashes it kept name the first entry that differs; without them (a v1 checkpoint),
    only the range since the last checkpoint that matches."""
    if kept:
        n = len(kept) // HASH_BYTES
        lo = cp.seq - n + 1
        stored = dict(conn.execute("SELECT seq, hash FROM entries WHERE seq BETWEEN ? AND ?", (lo, cp.seq)).fetchall())
        for i in range(n):
            seq = lo + i
            if stored.get(seq) != kept[i * HASH_BYTES : (i + 1) * HASH_BYTES]:
                return Problem(seq, ProblemKind.RESEALED, f"entry {seq} is not the entry checkpoint #{cp.id} sealed: the log was rewritten "
                               f"and re-hashed from entry {seq} on")
    lo = prev_ok + 1
    return Problem(lo, ProblemKind.RESEALED, f"entries {lo}..{cp.seq} no longer match checkpoint #{cp.id}: the chain was rewritten and re-hashed (the first altered entry lies in that range)")


def _check_close(report: VerifyReport, valid: list[Checkpoint], anchor: Checkpoint | None, walked_to: int, expect_closed: bool,
                 is_live: bool = True) -> None:
    """Entries after the last close record need a later signed checkpoint (the next
    writer's opening); a log that does not end with its close record is said to, and is a
    problem when the caller expected a clean stop."""
    closes = [c for c in valid if c.final] + ([anchor] if anchor is not None and anchor.final and anchor.seq <= walked_to else [])
    if closes:
        close = max(closes, key=lambda c: c.time)
        if walked_to > close.seq and not any(c.time > close.time for c in valid):
            where = "the anchor's close record" if close is anchor else f"its close record (checkpoint #{close.id})"
            report.problems.append(Problem(close.seq + 1, ProblemKind.APPENDED,
                                           f"entries {close.seq + 1}..{walked_to} follow {where} at entry {close.seq} with no signed "
                                           "reopening: they were appended by something other than policyc's writer"))
            return
    last = report.last_checkpoint
    report.closed = last is not None and last.final and last.seq == walked_to
    if report.closed:
        report.notes.append("the log was closed cleanly (final checkpoint at its last entry)")
        return
    why = (f"the log does not end with a close record: the durable log ends at entry {walked_to}; the service is running, "
           "was stopped without closing it (kill -9, power loss), or trailing entries were deleted with their checkpoints "
           "(the sealed head, or an anchor kept from later, `--anchor`, tells these apart)")
    if not is_live:
        report.problems.append(Problem(walked_to + 1, ProblemKind.SEGMENT_BROKEN,
                                       f"closed segment {report.path} does not end with its close record: it ends at entry {walked_to}; "
                                       "entries or its close record were removed"))
    elif expect_closed:
        report.problems.append(Problem(walked_to + 1, ProblemKind.NOT_CLOSED, why))
    else:
        report.notes.append(why)


def _check_anchor(report: VerifyReport, anchor: Checkpoint, hashes_at: dict[int, bytes], walked_to: int, complete: bool) -> None:
    if anchor.seq > walked_to:
        if complete:
            report.problems.append(Problem(walked_to + 1, ProblemKind.TRUNCATED, f"the log ends at entry {walked_to}, but the anchor checkpoint covers entries up to {anchor.seq}"))
        return
    h = hashes_at.get(anchor.seq)
    if h is None or h.hex() != anchor.hash:
        report.problems.append(Problem(anchor.seq, ProblemKind.RESEALED, f"entry {anchor.seq} no longer has the hash recorded in the anchor checkpoint"))


# ---------------------------------------------------------------------- diagnosis


def _row(conn: sqlite3.Connection, seq: int) -> tuple | None:
    return conn.execute(CHAIN_SELECT + " WHERE seq = ?", (seq,)).fetchone()


def _original_seq(row: tuple) -> int | None:
    """The seq this entry was written under, if it still hashes under one nearby."""
    seq, body, p, h = row
    if not isinstance(p, bytes) or not isinstance(body, bytes):
        return None
    for d in range(1, _SEARCH + 1):
        for cand in (seq + d, seq - d):
            if cand > 0 and digest(p, cand, body) == h:
                return cand
    return None


def _seq_with_hash(conn: sqlite3.Connection, h: object) -> int | None:
    row = conn.execute("SELECT seq FROM entries WHERE hash = ? LIMIT 1", (h,)).fetchone()
    return row[0] if row else None


def _diagnose(conn: sqlite3.Connection, wp: WalkProblem, prev: bytes, base_seq: int = 0) -> Problem:
    s = wp.seq
    if wp.kind is Break.DAMAGED:
        read = f"entries 1..{s - 1} were read and check out; " if s > 1 else ""
        return Problem(s, ProblemKind.DAMAGED, f"{wp.message}: {read}the log cannot be read from entry {s} on")
    if wp.kind is Break.GAP:
        if wp.found_seq > s:
            n = wp.found_seq - s
            return Problem(s, ProblemKind.DELETED, f"entr{'y' if n == 1 else 'ies'} {s}{'' if n == 1 else f'..{wp.found_seq - 1}'} missing: deleted from the log")
        return Problem(s, ProblemKind.EDITED, f"found seq {wp.found_seq} where {s} was expected")
    row = _row(conn, s)
    assert row is not None
    p = row[2]
    if wp.kind is Break.HASH:
        nxt = _row(conn, s + 1)
        if nxt is not None and nxt[2] == p and p == prev:
            return Problem(s, ProblemKind.INSERTED, f"entry {s} was inserted: the entry after it links to the same predecessor")
        orig = _original_seq(row)
        if orig is None:
            if p == prev:
                return Problem(s, ProblemKind.EDITED, "its content or index columns were changed after it was written")
            return Problem(s, ProblemKind.EDITED, "it was altered: neither its content nor its link to the previous entry check out")
        if orig < s:
            return Problem(orig, ProblemKind.INSERTED, f"entr{'y' if s - orig == 1 else 'ies'} {orig}..{s - 1} were inserted: entry {s} was written as entry {orig}")
        pred = _seq_with_hash(conn, p)
        if pred is not None and pred > s:
            return Problem(s, ProblemKind.REORDERED, f"entry {s} was written as entry {orig}; the entry that preceded it is now at {pred}")
        return Problem(s, ProblemKind.DELETED, f"entr{'y' if orig - s == 1 else 'ies'} written as {s}..{orig - 1} were deleted and later entries renumbered: entry {s} was written as entry {orig}")
    # Break.LINK: the entry itself hashes, but its predecessor is not the one it names.
    pred = _seq_with_hash(conn, p)
    if pred is None:
        if s == 1:
            return Problem(1, ProblemKind.EDITED, "entry 1 does not link to this log's genesis: the log id was changed or entry 1 replaced")
        if s == base_seq + 1:
            return Problem(s, ProblemKind.EDITED, f"entry {s} does not link to the entry its segment follows: it was replaced, or the segment's base edited")
        return Problem(s - 1, ProblemKind.EDITED, f"entry {s - 1} was altered and re-hashed: entry {s} still links to its original hash")
    if pred > s:
        return Problem(s, ProblemKind.REORDERED, f"entry {s} follows entry {pred}, which now comes after it")
    return Problem(pred + 1, ProblemKind.INSERTED, f"entries {pred + 1}..{s - 1} were inserted between entry {pred} and the entry written after it")
