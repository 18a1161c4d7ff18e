"""The quarantine book keeps the backends out now apart (a heap of their ends) so that a
break's account does not scan every backend ever quarantined: it must answer exactly as
the scan it replaced, on any sequence of decisions, records, releases and expiries."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.quarantine_book import QuarantineBook

BACKENDS = [Endpoint.of("10.0.0.1", 80 + i) for i in range(6)]


class ScanBook:
    """The reference: every question answered by scanning all entries."""

    def __init__(self) -> None:
        self.until: dict[Endpoint, float] = {}
        self.strikes: dict[Endpoint, tuple[int, float]] = {}

    def active(self, now: float) -> list[Endpoint]:
        return [b for b, u in self.until.items() if u > now]

    def decide(self, b: Endpoint, now: float, duration: float, max_duration: float, share: float) -> tuple[bool, float]:
        active = self.active(now)
        if b in active or len(active) + 1 > max(1, math.floor(share * len(BACKENDS))):  # at least one, as Envoy ejects
            return False, 0.0
        strikes, last_end = self.strikes.get(b, (0, -math.inf))
        return True, min(duration * 2 ** (strikes if now - last_end < 2 * max_duration else 0), max_duration)

    def record(self, b: Endpoint, now: float, duration: float, max_duration: float) -> None:
        strikes, last_end = self.strikes.get(b, (0, -math.inf))
        self.strikes[b] = (strikes + 1 if now - last_end < 2 * max_duration else 1, now + duration)
        self.until[b] = now + duration

    def released(self, b: Endpoint) -> None:
        if b in self.until:
            self.until[b] = 0.0


step = st.tuples(st.sampled_from(["decide", "record", "release", "active"]), st.integers(0, len(BACKENDS) - 1),
                 st.floats(0, 20), st.sampled_from([1.0, 5.0, 10.0]), st.sampled_from([0.2, 0.5, 1.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=60))
def test_the_book_answers_as_a_full_scan(steps: list[tuple[str, int, float, float, float]]) -> None:
    book, ref = QuarantineBook(), ScanBook()
    for b in BACKENDS:
        book.add_backend(b)
    now = 0.0
    for op, i, dt, duration, share in steps:
        now += dt
        b = BACKENDS[i]
        if op == "decide":
            d = book.decide(b, now, duration, 4 * duration, share)
            assert (d.allowed, d.duration) == ref.decide(b, now, duration, 4 * duration, share)
        elif op == "record":
            book.record(b, now, duration, 4 * duration)
            ref.record(b, now, duration, 4 * duration)
        elif op == "release":
            book.released(b)
            ref.released(b)
        assert sorted(book.active(now), key=str) == sorted(ref.active(now), key=str)
