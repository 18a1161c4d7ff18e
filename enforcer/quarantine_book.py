"""Which backends are quarantined, until when, and whether one more may be.

Quarantine expires and backs off (duration doubles on each repeat, up to max_duration), and
at most `max_share` of the known backends may be out at once, so that the breaker cannot
cause the outage it exists to prevent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policyc.enforcer.endpoint import Endpoint


@dataclass(frozen=True, slots=True)
class QuarantineDecision:
    allowed: bool
    duration: float  # seconds; 0 when refused
    reason: str


@dataclass(slots=True)
class _Entry:
    until: float
    strikes: int
    last_end: float


class QuarantineBook:
    def __init__(self) -> None:
        self._entries: dict[Endpoint, _Entry] = {}
        self._backends: set[Endpoint] = set()

    def add_backend(self, backend: Endpoint) -> None:
        self._backends.add(backend)

    def remove_backend(self, backend: Endpoint) -> None:
        self._backends.discard(backend)

    def active(self, now: float) -> list[Endpoint]:
        return [b for b, e in self._entries.items() if e.until > now]

    def decide(self, backend: Endpoint, now: float, duration: float, max_duration: float, max_share: float) -> QuarantineDecision:
        """May `backend` be quarantined now, and for how long? Does not record anything."""
        if backend not in self._backends:
            return QuarantineDecision(False, 0.0, f"{backend} is not a registered backend")
        active = self.active(now)
        if backend in active:
            return QuarantineDecision(False, 0.0, f"{backend} is already quarantined")
        cap = math.floor(max_share * len(self._backends))
        if len(active) + 1 > cap:
            return QuarantineDecision(False, 0.0, f"cap reached: {len(active)} of {len(self._backends)} backends out, max share {max_share:g} allows {cap}")
        entry = self._entries.get(backend)
        strikes = 0
        if entry is not None and now - entry.last_end < 2 * max_duration:
            strikes = entry.strikes  # a repeat offender within the memory window: back off
        return QuarantineDecision(True, min(duration * 2**strikes, max_duration), "")

    def record(self, backend: Endpoint, now: float, duration: float, max_duration: float) -> None:
        entry = self._entries.get(backend)
        strikes = entry.strikes + 1 if entry is not None and now - entry.last_end < 2 * max_duration else 1
        self._entries[backend] = _Entry(until=now + duration, strikes=strikes, last_end=now + duration)

    def expired(self, now: float) -> list[Endpoint]:
        """Backends whose quarantine has ended and that still need releasing."""
        return [b for b, e in self._entries.items() if e.until <= now and e.until > 0]

    def released(self, backend: Endpoint) -> None:
        entry = self._entries.get(backend)
        if entry is not None:
            entry.until = 0.0
