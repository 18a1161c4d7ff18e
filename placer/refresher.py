"""Keeps the current snapshot fresh: samples a telemetry source every interval on its own
thread, builds the next immutable snapshot and swaps it in atomically.

Before publishing a snapshot it builds the per-tick path tables (`paths.py`) and the
per-(tick, contract) tables (`tick_table.py`) the previous tick used, so the first
requests of a tick do not pay for them. It measures itself: each
refresh's latency (sample + build + tables) is kept, so the 200 ms tick
budget is a figure we report, not a hope. `tick()` does one refresh synchronously, which
tests and benchmarks use to step the world deterministically.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from .anomalies import AnomalyBoard
from .realtime import RealtimeOutcome, apply_realtime
from .paths import warm
from .snapshot import Snapshot, build_snapshot
from .telemetry import TelemetrySource
from .tick_table import warm_contracts
from .thresholds import Thresholds


class Refresher:
    """`Refresher(source, interval=0.2)`; `start()` / `stop()`; `current()`; `latencies()`."""

    def __init__(
        self, source: TelemetrySource, interval: float = 0.2, *, thresholds: Thresholds = Thresholds(),
        realtime_priority: int | None = None, cpus: tuple[int, ...] | None = None, history: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"refresh interval must be positive seconds, got {interval!r}")
        self.source = source
        self.interval = float(interval)
        self.thresholds = thresholds
        self.anomalies = AnomalyBoard()
        self._clock = clock
        self._rt = (realtime_priority, cpus)
        self._lat: deque[float] = deque(maxlen=history)
        self._spans: deque[tuple[float, float]] = deque(maxlen=history)
        self._snap: Snapshot | None = None
        self._prev: Snapshot | None = None
        self._version = 0
        self._lock = threading.Lock()  # serialises refreshes, never readers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.realtime: RealtimeOutcome | None = None
        self.overruns = 0
        self.errors: deque[str] = deque(maxlen=20)
        self._listeners: list[Callable[[Snapshot, Snapshot | None], None]] = []

    # ------------------------------------------------------------------ reading

    def current(self) -> Snapshot:
        """The latest snapshot (refreshing once if none exists yet)."""
        snap = self._snap
        return snap if snap is not None else self.tick()

    def previous(self) -> Snapshot | None:
        return self._prev

    def latencies(self) -> tuple[float, ...]:
        """Measured refresh latencies (seconds), oldest first."""
        return tuple(self._lat)

    def spans(self) -> tuple[tuple[float, float], ...]:
        """(start, end) of each measured refresh on the `time.perf_counter` clock, oldest
        first: lets a benchmark tell the requests that overlapped a refresh."""
        return tuple(self._spans)

    def is_stale(self) -> bool:
        snap = self._snap
        return snap is None or snap.is_stale(self._clock())

    def on_refresh(self, listener: Callable[[Snapshot, Snapshot | None], None]) -> None:
        """Call `listener(new, previous)` after each refresh (e.g. to push score changes)."""
        self._listeners.append(listener)

    def report_anomaly(self, host: str, gpu: str, signal: str, value: float) -> bool:
        """Lower a GPU's health from outside; visible on the next tick. False: unknown GPU."""
        i = self.source.topology().gpu_index.get((host, gpu))
        if i is None:
            return False
        self.anomalies.report(i, signal, value)
        return True

    # ------------------------------------------------------------------ refreshing

    def tick(self) -> Snapshot:
        """One refresh, now, on the calling thread."""
        with self._lock:
            t0 = time.perf_counter()
            taken = self._clock()
            topo = self.source.topology()
            frame = self.source.sample()
            prev = self._snap
            self._version += 1
            snap = build_snapshot(self._version, topo, frame, prev, self.anomalies.fold(len(topo.gpus)),
                                  self.thresholds, self.interval, taken)
            warm(snap, prev)  # the per-tick path tables requests will read, before they can ask
            warm_contracts(snap, prev)  # and the per-(tick, contract) tables on them
            self._prev, self._snap = prev, snap
            t1 = time.perf_counter()
            self._lat.append(t1 - t0)
            self._spans.append((t0, t1))
        for fn in self._listeners:
            fn(snap, prev)
        return snap

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="placer-refresher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> "Refresher":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        prio, cpus = self._rt
        if prio is not None or cpus:
            self.realtime = apply_realtime(prio, cpus)
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # a failing source must not kill the collector; the snapshot goes stale and says so
                self.errors.append(f"{type(e).__name__}: {e}")
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:
                self.overruns += 1
                next_at = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)
