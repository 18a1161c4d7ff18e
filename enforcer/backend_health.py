"""A model server's health as the kernel plane sees its traffic, for the backend breakers
(`scope: backend`, e.g. `error_rate > 50 %` three times in a row → quarantine).

The TC walker reports every HTTP/2 stream toward a registered backend when it ends: both
sides' END_STREAM (completed) or an RST_STREAM from either side (the call did not
complete: the gateway gave up on it at its timeout, or the server refused it). Per backend
and per window, the share of reset streams is its `error_rate`, one observation for
`Guardian.observe_backend`. A window in which no stream to a backend ended says nothing
about it and is not an observation (a streak neither grows nor restarts).

What the kernel cannot see: a call answered with a gRPC error status in its trailers
completed its stream (HPACK hides the status), so it is not counted as an error here; the
gateway's access log is the source for those.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection, Mapping

from policyc.enforcer.correlate import ERROR_RATE
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.kernel_abi import EventKind

WINDOW = 0.5  # seconds: a backend breaker counts consecutive windows


class BackendHealth:
    """`KernelPlane.subscribe(health)`; `flush(now_ns)` hands on closed windows."""

    def __init__(self, observe: Callable[[Endpoint, Mapping[str, float]], object], window: float = WINDOW) -> None:
        if not window > 0:
            raise ValueError(f"a backend health window must be positive, got {window}")
        self.observe = observe  # Guardian.observe_backend
        self.window_ns = int(window * 1e9)
        self._watched: frozenset[Endpoint] = frozenset()
        self._open: dict[tuple[Endpoint, int], list[int]] = {}  # (backend, window) -> [streams, resets]
        self._lock = threading.Lock()
        self.observations = 0

    def watch(self, backends: Collection[Endpoint]) -> None:
        """The backends to judge (the data path's registered ones); others' streams are ignored."""
        self._watched = frozenset(backends)

    def __call__(self, event: object) -> None:
        if event.kind is not EventKind.STREAM_DONE:  # type: ignore[attr-defined]
            return
        backend = event.b  # type: ignore[attr-defined]  # the stream's server side
        if backend not in self._watched:
            return
        slot = (backend, event.ts_ns // self.window_ns)  # type: ignore[attr-defined]
        with self._lock:
            counts = self._open.setdefault(slot, [0, 0])
            counts[0] += 1
            counts[1] += bool(event.reset)  # type: ignore[attr-defined]

    def flush(self, now_ns: int) -> int:
        """Observe every window that closed before `now_ns` (CLOCK_MONOTONIC), oldest first;
        returns how many."""
        current = now_ns // self.window_ns
        with self._lock:
            due = sorted((k for k in self._open if k[1] < current), key=lambda k: k[1])
            closed = [(k[0], self._open.pop(k)) for k in due]
        for backend, (streams, resets) in closed:
            self.observe(backend, {ERROR_RATE: resets / streams if streams else math.nan})
        self.observations += len(closed)
        return len(closed)
