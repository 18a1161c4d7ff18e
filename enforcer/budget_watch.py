"""Fires a callback when a request crosses its budget, on one timer thread for all requests.

A heap of deadlines and a condition variable: arming and disarming are O(log n), and the
thread wakes only for the earliest deadline, so thousands of in-flight requests cost one
sleeping thread rather than one timer each.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable


class BudgetWatch:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, Callable[[float], None]] = {}
        self._ids = itertools.count(1)
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="policyc-budget", daemon=True)
        self._thread.start()

    def arm(self, deadline: float, fire: Callable[[float], None]) -> int:
        """Call `fire(lateness_s)` once the clock passes `deadline`; returns a token."""
        token = next(self._ids)
        with self._cv:
            self._armed[token] = fire
            heapq.heappush(self._heap, (deadline, token))
            if self._heap[0][1] == token:
                self._cv.notify()
        return token

    def disarm(self, token: int) -> bool:
        """True if the callback had not fired yet (it now never will)."""
        with self._cv:
            return self._armed.pop(token, None) is not None

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and (not self._heap or self._heap[0][0] > self._clock()):
                    timeout = self._heap[0][0] - self._clock() if self._heap else None
                    self._cv.wait(timeout)
                if self._stopped:
                    return
                deadline, token = heapq.heappop(self._heap)
                fire = self._armed.pop(token, None)
            if fire is not None:
                fire(self._clock() - deadline)

    def close(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout=1)
