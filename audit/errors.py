"""Errors of the audit log. Every message names the place (the log's path, a record's seq)
and the problem, so the CLI and the auditor API can show it as-is, never as a traceback."""

from __future__ import annotations


class AuditError(Exception):
    """Base of every audit-log error."""


class AuditLogUnavailable(AuditError):
    """The log cannot be opened: missing, not an audit log, wrong schema, or held by another writer."""


class AuditLogDamaged(AuditLogUnavailable):
    """The file was an audit log but SQLite can no longer open it (a zeroed header page, an empty file)."""


class AuditLogCorrupt(AuditError):
    """The chain's tail does not hash as written: appending on top of it would hide tampering."""


class AuditWriteError(AuditError):
    """A record was not made durable (disk full, I/O error, log closed): it was not acknowledged."""


class AuditInputError(AuditError):
    """Bad input from a caller or user (a time, a key file, a format)."""
