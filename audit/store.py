"""The embedded store: one SQLite database in WAL mode.

SQLite gives what the log needs without a server: transactions (a batch of records and the
checkpoint that seals it become durable together or not at all), a write-ahead log whose
frames are checksummed (a torn write is recognised and rolled back on the next open), and
indexes for the auditor's queries. `synchronous=FULL` makes a commit durable against power
loss, not only against the process being killed.

One writer (`AuditLog`) at a time, guarded by a lock file; any number of read-only readers.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from pathlib import Path
from typing import Literal

from .chain import COLUMNS
from .errors import AuditLogDamaged, AuditLogUnavailable
from .schemas import ACTION_SCHEMA, DECISION_SCHEMA

STORE_SCHEMA = "policyc.audit.store/v2"  # what new logs are created as
STORE_V1 = "policyc.audit.store/v1"  # still read, verified and appended to
READABLE = (STORE_V1, STORE_SCHEMA)
PAGE_SIZE = 16384  # records are ~1.5 KB: fewer page splits, WAL frames and write calls (measured: 4096 1.3x, 8192 1.15-1.25x the insert CPU)
Durability = Literal["full", "normal"]

# The index columns' SQL types, in `chain.COLUMNS` order; `index_columns.index_row`
# derives their values from a record's body.
COLUMN_TYPES: dict[str, str] = {
    "kind": "TEXT", "time": "REAL", "decision_id": "TEXT", "tenant": "TEXT", "model": "TEXT", "region": "TEXT",
    "outcome": "TEXT", "action": "TEXT", "gpu_s": "REAL", "gpu_src": "TEXT", "mem_b": "REAL", "mem_src": "TEXT",
    "net_b": "REAL", "net_src": "TEXT", "latency_s": "REAL",
}
assert tuple(COLUMN_TYPES) == COLUMNS

# v2: plain columns the writer fills (`index_columns.index_row`); `verify` re-derives every
# entry's columns from its body and names the first that disagrees.
ENTRIES_DDL = (
    "CREATE TABLE entries (seq INTEGER PRIMARY KEY, body BLOB NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL, "
    + ", ".join(f"{c} {t}" for c, t in COLUMN_TYPES.items())
    + ")"
)

# v1: STORED GENERATED columns, derived by SQLite from the body on insert (about 30
# `json_extract` parses of the body per row: a third of the writer's CPU per record);
# `verify` checks that the table still has this definition (`consistency.py`).
# column -> (type, path in a decision body, path in an action body); None: NULL
INDEX_PATHS: dict[str, tuple[str, str | None, str | None]] = {
    "time": ("REAL", "$.time", "$.time"),
    "decision_id": ("TEXT", "$.decision_id", "$.decision_id"),
    "tenant": ("TEXT", "$.tenant", None),
    "model": ("TEXT", "$.model", None),
    "region": ("TEXT", "$.placement.region", None),
    "outcome": ("TEXT", "$.outcome", "$.outcome"),
    "action": ("TEXT", None, "$.kind"),
    "gpu_s": ("REAL", "$.resources.gpu_seconds.value", None),
    "gpu_src": ("TEXT", "$.resources.gpu_seconds.source", None),
    "mem_b": ("REAL", "$.resources.memory_bytes.value", None),
    "mem_src": ("TEXT", "$.resources.memory_bytes.source", None),
    "net_b": ("REAL", "$.resources.network_bytes.value", None),
    "net_src": ("TEXT", "$.resources.network_bytes.source", None),
    "latency_s": ("REAL", "$.latency.total", None),
}
KIND_EXPR = (
    f"CASE json_extract(CAST(body AS TEXT), '$.schema_version') WHEN '{DECISION_SCHEMA}' THEN 'decision' "
    f"WHEN '{ACTION_SCHEMA}' THEN 'action' END"
)


def derived_expr(col: str) -> str:
    """The SQL that derives index column `col` from `body` (store v1)."""
    _, dec, act = INDEX_PATHS[col]
    d = f"json_extract(CAST(body AS TEXT), '{dec}')" if dec else "NULL"
    a = f"json_extract(CAST(body AS TEXT), '{act}')" if act else "NULL"
    return f"CASE json_extract(CAST(body AS TEXT), '$.schema_version') WHEN '{DECISION_SCHEMA}' THEN {d} ELSE {a} END"


ENTRIES_DDL_V1 = (
    "CREATE TABLE entries (seq INTEGER PRIMARY KEY, body BLOB NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL, "
     f"kind TEXT GENERATED ALWAYS AS ({KIND_EXPR}) STORED, "
    + ", ".join(f"{c} {t} GENERATED ALWAYS AS ({derived_expr(c)}) STORED" for c, (t, _, _) in INDEX_PATHS.items())
    + ")"
)

_DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
{ENTRIES_DDL.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS")};
CREATE INDEX IF NOT EXISTS entries_decision ON entries (decision_id) WHERE decision_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_time ON entries (time);
CREATE TABLE IF NOT EXISTS checkpoints (
    id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, hash BLOB NOT NULL, time REAL NOT NULL,
    final INTEGER NOT NULL, public_key TEXT, signature TEXT, opens INTEGER NOT NULL DEFAULT 0, sealed BLOB
);
"""
# Checkpoint columns added after store v2 was first released; a writer adds them to an older log.
CHECKPOINT_ADDED = {"opens": "INTEGER NOT NULL DEFAULT 0", "sealed": "BLOB"}

ENTRY_SELECT = "SELECT seq, " + ", ".join(COLUMNS) + ", body, prev_hash, hash FROM entries"
CHAIN_SELECT = "SELECT seq, body, prev_hash, hash FROM entries"
INDEXED_CHAIN_SELECT = "SELECT seq, body, prev_hash, hash, " + ", ".join(COLUMNS) + " FROM entries"  # v2: the walk checks the columns too
ENTRY_INSERT = "INSERT INTO entries (seq, body, prev_hash, hash, " + ", ".join(COLUMNS) + ") VALUES (" + ", ".join(["?"] * (4 + len(COLUMNS))) + ")"


@functools.lru_cache(maxsize=128)
def insert_rows_sql(n: int, indexed: bool = True) -> str:
    """An INSERT of `n` entries in one statement: with their index columns (v2), or
    without (v1, where SQLite generates them)."""
    if not indexed:
        return "INSERT INTO entries (seq, body, prev_hash, hash) VALUES " + ", ".join(["(?, ?, ?, ?)"] * n)
    row = "(" + ", ".join(["?"] * (4 + len(COLUMNS))) + ")"
    return "INSERT INTO entries (seq, body, prev_hash, hash, " + ", ".join(COLUMNS) + ") VALUES " + ", ".join([row] * n)


def entries_definition_intact(conn: sqlite3.Connection) -> bool:
    """Whether a v1 entries table still derives its index columns from the body."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'entries'").fetchone()
    return row is not None and row[0] == ENTRIES_DDL_V1


def entries_columns_missing(conn: sqlite3.Connection) -> list[str]:
    """The columns a v2 entries table should have and does not (someone redefined it)."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(entries)")}
    return [c for c in ("seq", "body", "prev_hash", "hash", *COLUMNS) if c not in have]


def store_schema(conn: sqlite3.Connection) -> str:
    """The store schema of an open log (`_check_schema` has accepted it)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    return str(row[0])


def connect_writer(path: Path, durability: Durability) -> sqlite3.Connection:
    """Open (creating if needed) the store for appending."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # only takes effect on a new, empty database
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise AuditLogUnavailable(f"{path}: cannot put the audit log in WAL mode (got `{mode}`)")
        conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
            conn.executescript(_DDL)  # a new log; an existing one keeps its own definition (v1 or v2)
    except sqlite3.DatabaseError as e:
        raise AuditLogUnavailable(f"{path}: not an audit log ({e})") from None
    _check_schema(conn, path, create=True)
    have = {r[1] for r in conn.execute("PRAGMA table_info(checkpoints)")}
    for col, decl in CHECKPOINT_ADDED.items():
        if col not in have:
            conn.execute(f"ALTER TABLE checkpoints ADD COLUMN {col} {decl}")
    return conn


def checkpoint_select(conn: sqlite3.Connection) -> str:
    """SELECT id, seq, hash, time, final, public_key, signature, opens, sealed FROM checkpoints
    (NULLs for the columns an older log lacks)."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(checkpoints)")}
    added = ", ".join(c if c in have else f"NULL AS {c}" for c in CHECKPOINT_ADDED)
    return f"SELECT id, seq, hash, time, final, public_key, signature, {added} FROM checkpoints"


def connect_reader(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open an existing store read-only (auditors, `policyc audit ...`)."""
    p = Path(path)
    if not p.is_file():
        raise AuditLogUnavailable(f"{p}: no audit log here")
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as e:
        damage = _damage(p)
        if damage:
            raise AuditLogDamaged(f"{p}: the audit log file is damaged: {damage} (SQLite: {e}); nothing in it can be read") from None
        raise AuditLogUnavailable(f"{p}: not an audit log ({e})") from None
    try:
        _check_schema(conn, p, create=False)
    except AuditLogUnavailable:
        damage = _damage(p)
        if damage:
            raise AuditLogDamaged(f"{p}: the audit log file is damaged: {damage}; nothing in it can be read") from None
        raise
    return conn


def _damage(p: Path) -> str | None:
    """What makes a file that SQLite refuses look like a damaged audit log rather than some
    other file: a zeroed header, an empty file beside the log's lock file, a SQLite file
    shorter than its header says (truncated), or one whose schema names the log's tables."""
    try:
        with p.open("rb") as f:
            head = f.read(100)
        size = p.stat().st_size
    except OSError:
        return None
    if not head:
        return "the file is empty (truncated to 0 bytes)" if Path(f"{p}.lock").exists() else None
    if head.count(0) == len(head):
        return "its first page is zeroed"
    if not head.startswith(b"SQLite format 3\x00") or len(head) < 100:
        return None
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    if pages and size < pages * page:
        return f"it is truncated: {size} bytes where its header says {pages * page} ({size // page} of {pages} pages)"
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return "SQLite cannot read its schema"
    if names & {"entries", "checkpoints", "meta"}:
        return "a page of its tables is unreadable"
    return None


def _check_schema(conn: sqlite3.Connection, path: Path, *, create: bool) -> None:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    except sqlite3.DatabaseError:
        raise AuditLogUnavailable(f"{path}: not an audit log (no `meta` table)") from None
    if row is None:
        if not create:
            raise AuditLogUnavailable(f"{path}: not an audit log (no schema marker)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO meta VALUES ('schema', ?)", (STORE_SCHEMA,))
        conn.execute("INSERT INTO meta VALUES ('log_id', lower(hex(randomblob(16))))")
        conn.execute("COMMIT")
    elif row[0] not in READABLE:
        raise AuditLogUnavailable(f"{path}: unsupported audit log schema `{row[0]}`; this policyc reads {' and '.join(f'`{s}`' for s in READABLE)}")


def log_id(conn: sqlite3.Connection) -> str:
    row = conn.execute("SELECT value FROM meta WHERE key = 'log_id'").fetchone()
    return row[0] if row else ""


def segment_base(conn: sqlite3.Connection) -> tuple[int, int, bytes | None]:
    """(segment number, base seq, base hash) of an open store. A log's first segment (and
    every log written before rotation existed) is segment 1 on the log's genesis (base 0,
    hash None); a segment started by rotation continues the chain of the one it follows:
    its first entry is `base seq + 1` and links to `base hash` (`segments.py`)."""
    meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('segment', 'base_seq', 'base_hash')").fetchall())
    try:
        segment = int(meta.get("segment", 1))
        base = int(meta.get("base_seq", 0))
        base_hash = bytes.fromhex(meta["base_hash"]) if "base_hash" in meta else None
    except (TypeError, ValueError):
        raise AuditLogUnavailable("the log's segment marker in its `meta` table is not valid") from None
    return segment, base, base_hash


def create_segment(path: Path, lid: str, segment: int, base_seq: int, base_hash: bytes, *, durable: bool) -> None:
    """Create the store of segment `segment` at `path` (which must not exist), chained to
    the entry `base_seq` with hash `base_hash` of the segment before it. Built under a
    temporary name and renamed into place, so `path` is either absent or a whole store."""
    tmp = Path(f"{path}.new")
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
        leftover.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.executescript(_DDL)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema", STORE_SCHEMA), ("log_id", lid), ("segment", str(segment)),
                                                           ("base_seq", str(base_seq)), ("base_hash", base_hash.hex())])
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()
    if durable:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
