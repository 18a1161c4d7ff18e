"""Which backends are quarantined, until when, and whether one more may be.

Quarantine expires and backs off (duration doubles on each repeat, up to max_duration), and
at most `max_share` of the known backends may be out at once, so that the breaker cannot
cause the outage it exists to prevent — but always at least one, as Envoy's outlier
detection ejects at least one host whatever its `max_ejection_percent`: a quarantined
backend's traffic goes to its backup, so with 20 % of a pool of two the breaker would
otherwise never act at all.
"""

from __future__ import annotations

import heapq
import itertools
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
    """`decide` runs on every break's account: the backends out now are kept apart (with
    their ends in a heap, dropped as the clock passes them), so the check and the cap
    cost the same whatever the number of backends ever quarantined (`now` never goes back)."""

    def __init__(self) -> None:
        self._entries: dict[Endpoint, _Entry] = {}
        self._backends: set[Endpoint] = set()
        self._out: dict[Endpoint, float] = {}  # backend -> until, for those not yet seen to end
        self._ends: list[tuple[float, int, Endpoint]] = []  # (until, order, backend)
        self._order = itertools.count()

    def add_backend(self, backend: Endpoint) -> None:
        self._backends.add(backend)

    def remove_backend(self, backend: Endpoint) -> None:
        self._backends.discard(backend)

    def active(self, now: float) -> list[Endpoint]:
        return list(self._live(now))

    def _live(self, now: float) -> dict[Endpoint, float]:
        ends, out = self._ends, self._out
        while ends and ends[0][0] <= now:
            until, _, backend = heapq.heappop(ends)
            if out.get(backend) == until:
                del out[backend]
        return out

    def decide(self, backend: Endpoint, now: float, duration: float, max_duration: float, max_share: float) -> QuarantineDecision:
        """May `backend` be quarantined now, and for how long? Does not record anything."""
        if backend not in self._backends:
            return QuarantineDecision(False, 0.0, f"{backend} is not a registered backend")
        active = self._live(now)
        if backend in active:
            return QuarantineDecision(False, 0.0, f"{backend} is already quarantined")
        cap = max(1, math.floor(max_share * len(self._backends)))
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
        self._out[backend] = now + duration
        heapq.heappush(self._ends, (now + duration, next(self._order), backend))

    def expired(self, now: float) -> list[Endpoint]:
        """Backends whose quarantine has ended and that still need releasing."""
        return [b for b, e in self._entries.items() if e.until <= now and e.until > 0]

    def released(self, backend: Endpoint) -> None:
        entry = self._entries.get(backend)
        if entry is not None:
            entry.until = 0.0
        self._out.pop(backend, None)
