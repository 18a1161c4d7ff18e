"""Times as auditors type them (ISO 8601 or Unix seconds) and as reports print them (UTC)."""

from __future__ import annotations

from datetime import datetime, timezone

from .errors import AuditInputError


def parse_time(text: str, *, what: str = "time") -> float:
    """`2026-05-01`, `2026-05-01T12:00:00Z`, `2026-05-01T12:00+02:00` or `1777593600`.
    A time without a zone is UTC."""
    s = text.strip()
    try:
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s)
    except ValueError:
        raise AuditInputError(f"{what} `{text}` is not a time: use ISO 8601 (2026-05-01T12:00:00Z) or Unix seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def format_time(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
