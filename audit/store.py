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
from .errors import AuditLogUnavailable
from .schemas import ACTION_SCHEMA, DECISION_SCHEMA

STORE_SCHEMA = "policyc.audit.store/v1"  # (v1: generated index columns)
Durability = Literal["full", "normal"]

# Index columns are STORED GENERATED columns: SQLite derives them from the body on insert,
# so the body (which the hash chain covers) is their only source and SQL cannot set them
# apart from it (`verify` checks that the table still has this definition).
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
    """The SQL that derives index column `col` from `body`."""
    _, dec, act = INDEX_PATHS[col]
    d = f"json_extract(CAST(body AS TEXT), '{dec}')" if dec else "NULL"
    a = f"json_extract(CAST(body AS TEXT), '{act}')" if act else "NULL"
    return f"CASE json_extract(CAST(body AS TEXT), '$.schema_version') WHEN '{DECISION_SCHEMA}' THEN {d} ELSE {a} END"


ENTRIES_DDL = (
    "CREATE TABLE entries (seq INTEGER PRIMARY KEY, body BLOB NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL, "
    + f"kind TEXT GENERATED ALWAYS AS ({KIND_EXPR}) STORED, "
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
    final INTEGER NOT NULL, public_key TEXT, signature TEXT
);
"""

ENTRY_SELECT = "SELECT seq, " + ", ".join(COLUMNS) + ", body, prev_hash, hash FROM entries"
CHAIN_SELECT = "SELECT seq, body, prev_hash, hash FROM entries"
ENTRY_INSERT = "INSERT INTO entries (seq, body, prev_hash, hash) VALUES (?, ?, ?, ?)"


@functools.lru_cache(maxsize=64)
def insert_rows_sql(n: int) -> str:
    """An INSERT of `n` entries in one statement."""
    return "INSERT INTO entries (seq, body, prev_hash, hash) VALUES " + ", ".join(["(?, ?, ?, ?)"] * n)


def entries_definition_intact(conn: sqlite3.Connection) -> bool:
    """Whether the entries table still derives its index columns from the body."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'entries'").fetchone()
    return row is not None and row[0] == ENTRIES_DDL


def connect_writer(path: Path, durability: Durability) -> sqlite3.Connection:
    """Open (creating if needed) the store for appending."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise AuditLogUnavailable(f"{path}: cannot put the audit log in WAL mode (got `{mode}`)")
        conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        conn.executescript(_DDL)
    except sqlite3.DatabaseError as e:
        raise AuditLogUnavailable(f"{path}: not an audit log ({e})") from None
    _check_schema(conn, path, create=True)
    return conn


def connect_reader(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open an existing store read-only (auditors, `policyc audit ...`)."""
    p = Path(path)
    if not p.is_file():
        raise AuditLogUnavailable(f"{p}: no audit log here")
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as e:
        raise AuditLogUnavailable(f"{p}: not an audit log ({e})") from None
    _check_schema(conn, p, create=False)
    return conn


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
    elif row[0] != STORE_SCHEMA:
        raise AuditLogUnavailable(f"{path}: unsupported audit log schema `{row[0]}`; this policyc reads `{STORE_SCHEMA}`")


def log_id(conn: sqlite3.Connection) -> str:
    row = conn.execute("SELECT value FROM meta WHERE key = 'log_id'").fetchone()
    return row[0] if row else ""
