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


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str, *, what: str = "duration") -> float:
    """`90d`, `12h`, `30m`, `45s`, `2w` or plain seconds; must be positive."""
    s = text.strip().lower()
    unit = _UNITS.get(s[-1:]) if s else None
    number = s[:-1] if unit is not None else s
    try:
        value = float(number) * (unit or 1.0)
    except ValueError:
        raise AuditInputError(f"{what} `{text}` is not a duration: use e.g. 90d, 12h, 30m, 45s or seconds") from None
    if not value > 0 or value == float("inf"):
        raise AuditInputError(f"{what} `{text}` must be a positive, finite duration")
    return value
