"""Redaction of named request headers before a record is hashed and stored.

Headers such as `Authorization` carry credentials that must never reach an audit log (the
log is kept for years and handed to third parties). Redaction replaces the header's value
and, because a value can be copied elsewhere (a typed variable, a rejection reason), also
scrubs every other string of the record that contains it. It runs inside the log on every
append, so a caller that forgets cannot leak.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from pydantic import BaseModel

REDACTED = "[REDACTED]"
DEFAULT_REDACT: tuple[str, ...] = ("authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key")


class Redactor:
    """Redacts a fixed set of header names, matched case-insensitively."""

    __slots__ = ("names",)

    def __init__(self, names: Iterable[str] = DEFAULT_REDACT) -> None:
        self.names = frozenset(n.strip().lower() for n in names if n.strip())

    def secrets(self, headers: dict[str, str]) -> list[str]:
        """The values this redactor must hide in `headers` (non-empty ones)."""
        if not self.names:
            return []
        return [v for k, v in headers.items() if k.lower() in self.names and v and v != REDACTED]

    def dump(self, record: BaseModel, headers: dict[str, str]) -> str:
        """The record as compact JSON (None fields left out) with `headers` (its request
        headers) redacted and every copy of a redacted value scrubbed. The common case,
        nothing to redact, costs one serialisation."""
        return self.redact_json(record.model_dump_json(exclude_none=True), headers)

    def redact_json(self, text: str, headers: dict[str, str]) -> str:
        """`dump` from the record's compact JSON already written (`text`, None fields left
        out): the writer process's drafts are encoded without a pydantic model."""
        secrets = self.secrets(headers)
        if not secrets:
            return text
        body = json.loads(text)
        body["request"] = {k: (REDACTED if k.lower() in self.names else v) for k, v in headers.items()}
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        escaped = [json.dumps(s, ensure_ascii=False)[1:-1] for s in secrets]
        if not any(e in text or s in text for e, s in zip(escaped, secrets)):
            return text
        scrubbed = _scrub(body, tuple(sorted(set(secrets), key=len, reverse=True)))
        return json.dumps(scrubbed, separators=(",", ":"), ensure_ascii=False)


def _scrub(value: Any, secrets: tuple[str, ...]) -> Any:
    """Replace every secret inside string values (keys are schema names or header names,
    never values). Longest secrets first so that one containing another is fully hidden."""
    if isinstance(value, str):
        for s in secrets:
            if s in value:
                value = value.replace(s, REDACTED)
        return value
    if isinstance(value, dict):
        return {k: _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    return value
