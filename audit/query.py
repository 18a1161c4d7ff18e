"""Read-only queries for auditors: one decision with its actions, entries in a time range,
and aggregate reports. The gRPC auditor role and `policyc audit report|explain` both call
these; nothing here can write to the log.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from .chain import COLUMNS
from .checkpoints import Checkpoint
from .errors import AuditInputError, AuditLogCorrupt
from .records import ActionRecord, DecisionRecord, Entry, EntryKind
from .store import ENTRY_SELECT, connect_reader

GroupBy = Literal["model", "tenant", "region"]
GROUP_BY: tuple[str, ...] = ("model", "tenant", "region")
_N = len(COLUMNS)


@dataclass(frozen=True, slots=True)
class ReportRow:
    """Totals for one group. Measured, apportioned and estimated figures are summed apart:
    an auditor must be able to tell evidence from a share of it and from model."""

    key: str
    decisions: int
    admitted: int
    rejected: int
    failed: int
    compute_seconds_measured: float  # the model servers' own compute time (any device), from `accounting` records
    gpu_seconds_measured: float
    gpu_seconds_estimated: float
    memory_bytes_measured: float
    memory_bytes_estimated: float
    network_bytes_measured: float
    network_bytes_estimated: float
    unaccounted: int  # decisions with at least one resource figure absent
    latency_mean: float
    latency_max: float
    compute_seconds_apportioned: float = 0.0  # shares of a measured total (cgroup CPU time across concurrent calls)
    gpu_seconds_apportioned: float = 0.0
    memory_bytes_apportioned: float = 0.0


@dataclass(frozen=True, slots=True)
class Report:
    start: float | None
    end: float | None
    by: GroupBy
    rows: tuple[ReportRow, ...]
    total: ReportRow
    actions: int


@dataclass(frozen=True, slots=True)
class Explanation:
    """A decision, the actions it triggered, and the checkpoint that seals it (if any yet)."""

    entry: Entry
    actions: tuple[Entry, ...]
    sealed_by: Checkpoint | None


def _range(start: float | None, end: float | None) -> tuple[str, list[float]]:
    if start is not None and end is not None and end < start:
        raise AuditInputError(f"time range is empty: end ({end}) is before start ({start})")
    where, args = [], []
    if start is not None:
        where.append("time >= ?")
        args.append(start)
    if end is not None:
        where.append("time < ?")
        args.append(end)
    return (" AND " + " AND ".join(where)) if where else "", args


class AuditReader:
    """A read-only view of a log (safe while the writer is appending). A rotated log is
    read as one: its kept closed segments are attached and `entries` is their union with
    the live file's (`segments.py`), up to SQLite's limit of attached files; segments beyond
    it (the oldest) are left out and counted in `segments_left_out`."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self.path = path
        self.segments_left_out = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> AuditReader:
        from .segments import closed_segments

        reader = cls(connect_reader(path), str(path))
        closed = closed_segments(path)
        if closed:
            reader._attach([p for _, p in closed])
        return reader

    def _attach(self, paths: list[os.PathLike[str]]) -> None:
        room = self._conn.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED) - 1  # one for the temp schema's view
        kept = paths[-room:] if room > 0 else []
        self.segments_left_out = len(paths) - len(kept)
        names = []
        for i, p in enumerate(kept):
            name = f"seg{i}"
            self._conn.execute("ATTACH DATABASE ? AS " + name, (f"{Path(p).resolve().as_uri()}?mode=ro",))
            names.append(name)
        union = " UNION ALL ".join([f"SELECT * FROM {n}.entries" for n in names] + ["SELECT * FROM main.entries"])
        self._conn.execute(f"CREATE TEMP VIEW entries AS {union}")
        cols = "id, seq, hash, time, final, public_key, signature"  # (ids restart in each segment; seqs do not)
        union = " UNION ALL ".join([f"SELECT {cols} FROM {n}.checkpoints" for n in names] + [f"SELECT {cols} FROM main.checkpoints"])
        self._conn.execute(f"CREATE TEMP VIEW checkpoints AS {union}")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> AuditReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _entry(self, row: tuple) -> Entry:
        seq, kind, body = row[0], row[1], row[_N + 1]
        try:
            rec = DecisionRecord.model_validate_json(body) if kind == EntryKind.DECISION.value else ActionRecord.model_validate_json(body)
        except (ValidationError, TypeError) as e:
            raise AuditLogCorrupt(f"{self.path}: entry {seq} is not a valid {kind} record ({e.__class__.__name__}); run `policyc audit verify`") from None
        p, h = row[_N + 2], row[_N + 3]
        return Entry(seq=seq, kind=EntryKind(kind), prev_hash=bytes(p).hex(), hash=bytes(h).hex(), record=rec)

    def decision(self, decision_id: str) -> Entry | None:
        """The decision entry with this id (None if there is none)."""
        row = self._conn.execute(ENTRY_SELECT + " WHERE decision_id = ? AND kind = 'decision' ORDER BY seq LIMIT 1", (decision_id,)).fetchone()
        return self._entry(row) if row else None

    def actions_for(self, decision_id: str) -> list[Entry]:
        rows = self._conn.execute(ENTRY_SELECT + " WHERE decision_id = ? AND kind = 'action' ORDER BY seq", (decision_id,))
        return [self._entry(r) for r in rows]

    def sealed_by(self, seq: int) -> Checkpoint | None:
        """The first checkpoint covering entry `seq`."""
        row = self._conn.execute("SELECT id, seq, hash, time, final, public_key, signature FROM checkpoints WHERE seq >= ? ORDER BY seq LIMIT 1", (seq,)).fetchone()
        if row is None:
            return None
        return Checkpoint(id=row[0], seq=row[1], hash=bytes(row[2]).hex(), time=row[3], final=bool(row[4]), public_key=row[5], signature=row[6])

    def explain(self, decision_id: str) -> Explanation | None:
        entry = self.decision(decision_id)
        if entry is None:
            return None
        return Explanation(entry, tuple(self.actions_for(decision_id)), self.sealed_by(entry.seq))

    def entries(self, *, start: float | None = None, end: float | None = None, kind: EntryKind | None = None, after_seq: int = 0, limit: int = 1000) -> list[Entry]:
        """Entries with start <= time < end, in seq order, `limit` at a time; page with
        `after_seq` = the last seq of the previous page."""
        where, args = _range(start, end)
        if kind is not None:
            where += " AND kind = ?"
            args.append(kind.value)  # type: ignore[arg-type]
        rows = self._conn.execute(ENTRY_SELECT + f" WHERE seq > ?{where} ORDER BY seq LIMIT ?", (after_seq, *args, limit))
        return [self._entry(r) for r in rows]

    def time_span(self, *, start: float | None = None, end: float | None = None) -> tuple[float | None, float | None]:
        """(first, last) decision time in [start, end), (None, None) when there is none."""
        where, args = _range(start, end)
        t0, t1 = self._conn.execute(f"SELECT min(time), max(time) FROM entries WHERE kind = 'decision'{where}", args).fetchone()
        return t0, t1

    def report(self, *, by: GroupBy, start: float | None = None, end: float | None = None) -> Report:
        """Decisions and resources per model, tenant or region over [start, end)."""
        if by not in GROUP_BY:
            raise AuditInputError(f"cannot group by `{by}`: choose one of {', '.join(GROUP_BY)}")
        where, args = _range(start, end)
        sql = f"""
            SELECT coalesce({by}, '(none)'), count(*),
                   sum(outcome = 'admitted'), sum(outcome = 'rejected'), sum(outcome = 'failed'),
                   total(a.cmp),
                   total(CASE WHEN gpu_src = 'measured' THEN gpu_s END) + total(a.gpu),
                   total(CASE WHEN gpu_src = 'estimated' THEN gpu_s END),
                   total(CASE WHEN mem_src = 'measured' THEN mem_b END) + total(a.mem),
                   total(CASE WHEN mem_src = 'estimated' THEN mem_b END),
                   total(CASE WHEN net_src = 'measured' THEN net_b END) + total(a.net),
                   total(CASE WHEN net_src = 'estimated' THEN net_b END),
                   sum((gpu_src IS NULL AND a.gpu IS NULL AND a.gpu_a IS NULL) OR (mem_src IS NULL AND a.mem IS NULL AND a.mem_a IS NULL)
                       OR (net_src IS NULL AND a.net IS NULL)),
                   total(latency_s) / max(count(*), 1), coalesce(max(latency_s), 0),
                   total(a.cmp_a),
                   total(CASE WHEN gpu_src = 'apportioned' THEN gpu_s END) + total(a.gpu_a),
                   total(CASE WHEN mem_src = 'apportioned' THEN mem_b END) + total(a.mem_a)
            FROM entries LEFT JOIN ({ACCOUNTED}) AS a ON a.did = entries.decision_id
            WHERE kind = 'decision'{where} GROUP BY 1 ORDER BY 1"""
        rows = tuple(ReportRow(*r) for r in self._conn.execute(sql, [LEGACY_COMPUTE_METHOD, *args]))
        actions = self._conn.execute(f"SELECT count(*) FROM entries WHERE kind = 'action'{where}", args).fetchone()[0]
        return Report(start, end, by, rows, _total(rows), actions)


# How an `accounting` record written before `Resources.compute_seconds` existed is read:
# those records carried the model server's compute time in `gpu_seconds` (measured, with
# this method), which was never GPU time; the report counts it as compute time, so old logs
# report what they measured under the right name. Their bodies (and hashes) are untouched.
# Compute seconds have no index column (that would be a new store schema): the report reads
# them from the accounting bodies (measured: 1.1-1.6x the report's time over 20,000 calls).
LEGACY_COMPUTE_METHOD = "model server compute time (%"
_LEGACY = "(CASE WHEN gpu_src = 'measured' THEN json_extract(CAST(body AS TEXT), '$.resources.gpu_seconds.method') LIKE ? ELSE 0 END)"

# Per decision id, the measured figures of its `accounting` records (one per call through
# the gateway: Envoy's access log and the model server's compute time), joined to the
# decision in `report` so its measured columns count what the data plane measured.
ACCOUNTED = f"""SELECT decision_id AS did,
                      sum(CASE WHEN gpu_src = 'measured' AND NOT legacy THEN gpu_s END) AS gpu,
                      sum(CASE WHEN mem_src = 'measured' THEN mem_b END) AS mem,
                      sum(CASE WHEN net_src = 'measured' THEN net_b END) AS net,
                      sum(CASE WHEN legacy THEN gpu_s WHEN cmp_src = 'measured' THEN cmp END) AS cmp,
                      sum(CASE WHEN gpu_src = 'apportioned' THEN gpu_s END) AS gpu_a,
                      sum(CASE WHEN mem_src = 'apportioned' THEN mem_b END) AS mem_a,
                      sum(CASE WHEN cmp_src = 'apportioned' THEN cmp END) AS cmp_a
               FROM (SELECT decision_id, gpu_s, gpu_src, mem_b, mem_src, net_b, net_src, {_LEGACY} AS legacy,
                            json_extract(CAST(body AS TEXT), '$.resources.compute_seconds.value') AS cmp,
                            json_extract(CAST(body AS TEXT), '$.resources.compute_seconds.source') AS cmp_src
                     FROM entries WHERE kind = 'action' AND action = 'accounting' AND decision_id IS NOT NULL)
               GROUP BY decision_id"""


def _total(rows: tuple[ReportRow, ...]) -> ReportRow:
    n = sum(r.decisions for r in rows)
    return ReportRow(
        "total",
        n,
        sum(r.admitted for r in rows),
        sum(r.rejected for r in rows),
        sum(r.failed for r in rows),
        sum(r.compute_seconds_measured for r in rows),
        sum(r.gpu_seconds_measured for r in rows),
        sum(r.gpu_seconds_estimated for r in rows),
        sum(r.memory_bytes_measured for r in rows),
        sum(r.memory_bytes_estimated for r in rows),
        sum(r.network_bytes_measured for r in rows),
        sum(r.network_bytes_estimated for r in rows),
        sum(r.unaccounted for r in rows),
        sum(r.latency_mean * r.decisions for r in rows) / n if n else 0.0,
        max((r.latency_max for r in rows), default=0.0),
        sum(r.compute_seconds_apportioned for r in rows),
        sum(r.gpu_seconds_apportioned for r in rows),
        sum(r.memory_bytes_apportioned for r in rows),
    )
