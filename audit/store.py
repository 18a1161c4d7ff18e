"""The embedded store: one SQLite database in WAL mode.

SQLite gives what the log needs without a server: transactions (a batch of records and the
checkpoint that seals it become durable together or not at all), a write-ahead log whose
frames are checksummed (a torn write is recognised and rolled back on the next open), and
indexes for the auditor's queries. `synchronous=FULL` makes a commit durable against power
loss, not only against the process being killed.

One writer (`AuditLog`) at a time, guarded by a lock file; any number of read-only readers.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Literal

from .chain import COLUMNS
from .errors import AuditLogUnavailable

STORE_SCHEMA = "policyc.audit.store/v1"
Durability = Literal["full", "normal"]

_DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL, time REAL NOT NULL, decision_id TEXT, tenant TEXT, model TEXT,
    region TEXT, outcome TEXT, action TEXT, gpu_s REAL, gpu_src TEXT, mem_b REAL,
    mem_src TEXT, net_b REAL, net_src TEXT, latency_s REAL,
    body TEXT NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_decision ON entries (decision_id) WHERE decision_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_time ON entries (time);
CREATE TABLE IF NOT EXISTS checkpoints (
    id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, hash BLOB NOT NULL, time REAL NOT NULL,
    final INTEGER NOT NULL, public_key TEXT, signature TEXT
);
"""

ENTRY_SELECT = "SELECT seq, " + ", ".join(COLUMNS) + ", body, prev_hash, hash FROM entries"
ENTRY_INSERT = (
    "INSERT INTO entries (seq, " + ", ".join(COLUMNS) + ", body, prev_hash, hash) VALUES ("
    + ", ".join("?" * (len(COLUMNS) + 4)) + ")"
)


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
