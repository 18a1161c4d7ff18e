"""Ends quarantined backends' established connections, a batch at a time, off the budget's threads.

A quarantine moves new connections at once (the kernel map); ending those already open is
the slower half, since the kernel walks its whole socket table to find them (~0.15 ms per
address family, the same for one backend or a thousand). Quarantines come in bursts — a
slow backend breaks many budgets at once, a storm quarantines many backends — so the ender
waits `window` after the first request for more, then ends them all in one walk per
family; a walk per quarantine was most of the CPU a burst of breaks cost, taken from the
threads that cancel streams. Each request's outcome is still reported on its own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.plane import EnforcementPlane

log = logging.getLogger(__name__)

Outcome = int | Exception  # connections ended, or why ending them failed


class ConnectionEnder:
    def __init__(self, plane: EnforcementPlane, done: Callable[[Endpoint, str, Outcome], None], window: float = 0.005,
                 room: Callable[[], None] | None = None) -> None:
        """`done(backend, rule, outcome)` runs on the ender's thread once per `submit`.
        `room()`, when given, returns when the walk may start (the guardian's: once no budget
        crossing is near, so the walk's share of the interpreter never delays a cancel)."""
        self._plane = plane
        self._done = done
        self._window = window
        self._room = room
        self._queue: queue.SimpleQueue[tuple[Endpoint, str] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="policyc-end-connections", daemon=True)
        self._thread.start()

    def submit(self, backend: Endpoint, rule: str) -> None:
        """End `backend`'s established connections soon (within `window` plus the walk)."""
        self._queue.put((backend, rule))

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            time.sleep(self._window)  # let the rest of a burst arrive
            batch = [first]
            stop = False
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            if self._room is not None:
                self._room()
            self._end(batch)
            if stop:
                return

    def _end(self, batch: list[tuple[Endpoint, str]]) -> None:
        backends = list(dict.fromkeys(b for b, _ in batch))
        try:
            counts: dict[Endpoint, Outcome] = dict(self._plane.end_connections_many(backends))
        except Exception:  # noqa: BLE001 - one bad backend must not fail the batch: each on its own
            counts = {}
            for b in backends:
                try:
                    counts[b] = self._plane.end_connections(b)
                except Exception as exc:  # noqa: BLE001 - reported as that backend's outcome
                    counts[b] = exc
        for backend, rule in batch:
            outcome = counts.pop(backend, 0)  # a backend named twice in a batch: its connections end once
            try:
                self._done(backend, rule, outcome)
            except Exception:  # noqa: BLE001 - the report is someone else's code
                log.exception("reporting ended connections failed")

    def close(self) -> None:
        """End what was submitted, then stop."""
        self._queue.put(None)
        self._thread.join(timeout=5)
