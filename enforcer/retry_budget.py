"""Envoy's retry budget: retries in flight never exceed a share of active requests.

Without it, a breaker that redirects every slow request doubles the load on a cluster that
is slow because it is overloaded. `min_concurrency` (Envoy's `min_retry_concurrency`) keeps
a small service able to retry at all.
"""

from __future__ import annotations

import threading


class RetryBudget:
    def __init__(self, share: float, min_concurrency: int = 1) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"retry budget share {share} is not in [0, 1]")
        self.share = share
        self.min_concurrency = min_concurrency
        self._active = 0
        self._retries = 0
        self._lock = threading.Lock()

    def request_started(self) -> None:
        with self._lock:
            self._active += 1

    def request_finished(self) -> None:
        with self._lock:
            self._active = max(0, self._active - 1)

    def allowed(self) -> int:
        with self._lock:
            return max(int(self.share * self._active), self.min_concurrency)

    def try_acquire(self) -> bool:
        """Take one retry slot if the budget allows; pair with `release` when it ends."""
        with self._lock:
            limit = max(int(self.share * self._active), self.min_concurrency)
            if self._retries + 1 > limit:
                return False
            self._retries += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._retries = max(0, self._retries - 1)

    @property
    def retries_in_flight(self) -> int:
        return self._retries
