"""Keeps the current snapshot fresh: samples a telemetry source every interval, builds the
next immutable snapshot and swaps it in atomically.

Before publishing a snapshot it builds the per-tick path tables (`paths.py`) and the
per-(tick, contract) tables (`tick_table.py`) the previous tick used, so the first
requests of a tick do not pay for them. It measures itself: each refresh's latency
(sample + build + tables + listeners) is kept, so the 200 ms tick budget is a figure we
report, not a hope. `tick()` does one refresh synchronously, which tests and benchmarks
use to step the world deterministically.

Two clocks: the telemetry source is sampled every `interval` (the fabric's and GPUs'
telemetry, and what the snapshot derives from it: a fabric search, scores, listeners), and,
given `measured_interval` and a source whose frames carry the model servers' own readings
(`measured.WithReadings`), those readings are taken again in between, every
`measured_interval`, onto the last snapshot (`Snapshot.remeasured`: its per-tick tables
rebuilt, nothing else). A gateway's scraped queues then reach placement within a scrape and
a measured tick, and the search over a fabric that changes on its own clock is not run at
the scrape's: at 128 simulated GPUs a full refresh is ~1.5 ms of CPU in-process (about 3.7 ms
on a gateway's loop, with its listeners), a measured one ~0.17 ms (`benchmarks/RESULTS.md`,
"the readings on their own clock").

A refresh is a sequence of steps (sample and build, each path table, each contract table,
publish, each listener), and it runs in one of two places:
- its own thread (`start()`): the placer on its own, optionally SCHED_FIFO and pinned;
- an asyncio event loop (`start(loop)`), one step per callback: the decision service's.
  There every request the loop serves shares one interpreter lock with the refresh. From
  another thread a refresh of a few milliseconds holds that lock in slices of the
  interpreter's switch interval (5 ms), and the loop waits out each one: paced decisions
  queued behind every tick (`benchmarks/RESULTS.md`, serve, seventh pass). As loop
  callbacks the steps simply queue between requests, none longer than a table build.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Callable, Generator, Iterable, NamedTuple

from .anomalies import AnomalyBoard
from .realtime import RealtimeOutcome, apply_realtime
from .paths import warm_steps
from .snapshot import Snapshot, build_steps
from .telemetry import TelemetryFrame, TelemetrySource
from .tick_table import warm_contract_steps
from .thresholds import Thresholds

STEPS_KEPT = 48  # step records kept per refresh of history (a refresh at 20,000 instances is ~40 steps)
LOOP_SHARE = 0.25  # on an event loop, a refresh's steps take at most this share of the loop's time
SPREAD = 0.4  # ... and, at the last refresh's work, are spread over this part of the cadence
SLICE = 0.3e-3  # seconds of steps run back to back in one loop callback

# a refresh listener: `fn(new, previous)`, returning its own steps (any iterable) or None
Listener = Callable[[Snapshot, Snapshot | None], Iterable[object] | None]


class StepRecord(NamedTuple):
    """One step of a refresh: its span on the `time.perf_counter` clock, the CPU seconds of
    the thread that ran it, and what it did."""

    start: float
    end: float
    cpu: float
    kind: str


class _Refresh:
    """One refresh in progress: its steps, the seconds they took so far, and its snapshot
    once done. `full`: the source sampled (False: the measured readings only)."""

    def __init__(self, steps: Generator[str, None, Snapshot], full: bool) -> None:
        self.steps = steps
        self.full = full
        self.work = 0.0
        self.snapshot: Snapshot | None = None


class Refresher:
    """`Refresher(source, interval=0.2, measured_interval=None)`; `start()` (a thread) or
    `start(loop)` / `stop()`; `current()`; `latencies()`."""

    def __init__(
        self, source: TelemetrySource, interval: float = 0.2, *, measured_interval: float | None = None,
        thresholds: Thresholds = Thresholds(), realtime_priority: int | None = None, cpus: tuple[int, ...] | None = None,
        history: int = 1000, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"refresh interval must be positive seconds, got {interval!r}")
        if measured_interval is not None and not measured_interval > 0:
            raise ValueError(f"measured refresh interval must be positive seconds, got {measured_interval!r}")
        self.source = source
        self.interval = float(interval)
        self.measured_interval = measured_interval
        self._last_work = {True: 0.0, False: 0.0}  # the last full and measured refresh's seconds of work
        self.thresholds = thresholds
        self.anomalies = AnomalyBoard()
        self._clock = clock
        self._rt = (realtime_priority, cpus)
        self._lat: deque[float] = deque(maxlen=history)
        # (start, end, cpu, kind) per step: plain tuples of atoms, which the collector stops
        # tracking after one pass (a NamedTuple's instances it tracks for ever)
        self._steps: deque[tuple[float, float, float, str]] = deque(maxlen=STEPS_KEPT * history)
        self._snap: Snapshot | None = None
        self._prev: Snapshot | None = None
        self._version = 0
        self._lock = threading.Lock()  # serialises refreshes, never readers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._run = 0  # bumped by start and stop: a loop-driven chain of another run ends
        self.realtime: RealtimeOutcome | None = None
        self.overruns = 0
        self.errors: deque[str] = deque(maxlen=20)
        self._listeners: list[Listener] = []

    @property
    def _remeasure(self) -> Callable[[TelemetryFrame], TelemetryFrame] | None:
        """The source's way to take its readings again, where it has one and their clock is
        the faster (read each time: a replica wraps the source after it is made)."""
        m = self.measured_interval
        fn = getattr(self.source, "remeasure", None)
        return fn if m is not None and m < self.interval and callable(fn) else None

    @property
    def cadence(self) -> float:
        """Seconds between two refreshes: the readings' clock where they have one of their
        own, else the telemetry's."""
        return self.measured_interval if self._remeasure is not None else self.interval  # type: ignore[return-value]

    # ------------------------------------------------------------------ reading

    def current(self) -> Snapshot:
        """The latest snapshot (refreshing once if none exists yet)."""
        snap = self._snap
        return snap if snap is not None else self.tick()

    def previous(self) -> Snapshot | None:
        return self._prev

    def latencies(self) -> tuple[float, ...]:
        """Measured refresh latencies (seconds of work: the sum of a refresh's steps),
        oldest first."""
        return tuple(self._lat)

    def spans(self) -> tuple[tuple[float, float], ...]:
        """(start, end) of each step of the recent refreshes on the `time.perf_counter`
        clock, oldest first (a synchronous tick's steps are back to back): lets a benchmark
        tell the requests that overlapped one."""
        return tuple((r[0], r[1]) for r in tuple(self._steps))

    def step_cpu(self) -> tuple[float, ...]:
        """The CPU seconds of the thread that ran each step of `spans()`, in the same order:
        a step's span on a busy machine includes the time the thread was not running at all,
        its CPU time is what the step itself held the loop (or the interpreter) for."""
        return tuple(r[2] for r in tuple(self._steps))

    def step_records(self) -> tuple[StepRecord, ...]:
        """Each step of `spans()` with its CPU seconds and what it did ("snapshot: fabric
        search", "path table", "listener ScorePusher.steps", ...), read at one instant (two
        reads one after the other while a loop refreshes may be a step apart): lets a
        benchmark tell which kind of step holds a serving loop long."""
        return tuple(StepRecord(*r) for r in tuple(self._steps))

    def is_stale(self) -> bool:
        snap = self._snap
        return snap is None or snap.is_stale(self._clock())

    def on_refresh(self, listener: Listener) -> None:
        """Call `listener(new, previous)` after each refresh (e.g. to push score changes).
        A listener may return an iterable of its own steps: each item is one more step of
        the refresh (run, on a loop, like the refresher's own)."""
        self._listeners.append(listener)

    def report_anomaly(self, host: str, gpu: str, signal: str, value: float) -> bool:
        """Lower a GPU's health from outside; visible on the next tick. False: unknown GPU."""
        i = self.source.topology().gpu_index.get((host, gpu))
        if i is None:
            return False
        self.anomalies.report(i, signal, value)
        return True

    # ------------------------------------------------------------------ refreshing

    def tick(self, full: bool | None = True) -> Snapshot:
        """One refresh, now, on the calling thread: full (the source sampled), or, with
        `full=None`, the one the running refresher would do at this moment (measured only,
        unless the telemetry is due)."""
        r = self._begin(full)
        while self._step(r) is not None:
            pass
        assert r.snapshot is not None
        return r.snapshot

    def _step(self, r: _Refresh) -> float | None:
        """Run the next step of `r` and record its span: its seconds, or None when that
        was the last one (and the refresh's latency is recorded)."""
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            kind = next(r.steps)
        except StopIteration as done:
            r.snapshot = done.value
            kind = "end"
        t1 = time.perf_counter()
        self._steps.append((t0, t1, time.thread_time() - c0, kind))
        r.work += t1 - t0
        if r.snapshot is None:
            return t1 - t0
        self._lat.append(r.work)
        self._last_work[r.full] = r.work
        return None

    def share(self, full: bool = True) -> float:
        """The share of an event loop's time a refresh's steps take: what spreads the last
        refresh of the kind's work over `SPREAD` of the cadence, at most `LOOP_SHARE` (and
        that until one has been measured)."""
        last = self._last_work[full]
        return min(LOOP_SHARE, last / (SPREAD * self.cadence)) if last > 0 else LOOP_SHARE

    def _begin(self, full: bool | None = None) -> _Refresh:
        """A refresh: full when asked, or (None) when the snapshot's telemetry is due for a
        sample (an interval old, less half a cadence), none exists, or the source has no
        readings to take on their own."""
        prev = self._snap
        if full is None:
            full = (self._remeasure is None or prev is None
                    or self._clock() - prev.taken_at >= self.interval - self.cadence / 2)
        return _Refresh(self._refresh() if full else self._refresh_measured(), full)

    def _refresh_measured(self) -> Generator[str, None, Snapshot]:
        """The readings taken again onto the current snapshot, and its per-tick tables
        rebuilt; no listener runs (nothing they read changed). No new snapshot when the readings
        are the ones it has (none scraped, or only a replica's host readings, which change with a
        sample): such a service pays for the tick's tables once per sample, as without this
        clock, and its snapshot versions count samples. Falls back to a full refresh
        where there is nothing to build on (no snapshot, the topology changed, or the source
        no longer has readings of its own)."""
        with self._lock:
            prev, remeasure = self._snap, self._remeasure
            same = remeasure is not None and prev is not None and prev.topology is self.source.topology()
            if same:
                frame = remeasure(prev.frame)  # type: ignore[misc,union-attr]
                unchanged = frame.measured == prev.frame.measured  # type: ignore[union-attr]
                if not unchanged:
                    self._version += 1
                    version = self._version
        if prev is None or not same:
            return (yield from self._refresh())
        yield "sample: measured"
        if unchanged:  # no reading taken again differs (none scraped; only a replica's hosts'): nothing to redo
            return prev
        snap = prev.remeasured(version, frame)
        yield from self._warm_and_publish(snap, prev)
        yield "publish"
        return snap

    def _warm_and_publish(self, snap: Snapshot, prev: Snapshot | None) -> Generator[str, None, bool]:
        """The per-tick path tables requests will read, before they can ask, and the
        per-(tick, contract) tables on them; then `snap` published unless a newer one was
        meanwhile (a refresh by hand): whether it was."""
        yield from warm_steps(snap, prev)
        yield from warm_contract_steps(snap, prev)
        with self._lock:
            current = self._snap
            if current is None or current.version < snap.version:
                self._prev, self._snap = prev, snap
            return self._snap is snap

    def _refresh(self) -> Generator[str, None, Snapshot]:
        """One refresh as steps (yields between two the kind of the step just done). Sampling
        and publishing hold the lock; the steps between read only their own snapshot, so a
        refresh by hand (`tick()`) while a loop-driven one is half-way is safe: the newer
        version is kept."""
        with self._lock:
            taken = self._clock()
            topo = self.source.topology()
            frame = self.source.sample()
            prev = self._snap
            self._version += 1
            version = self._version
        yield "sample"
        snap = yield from build_steps(version, topo, frame, prev, self.anomalies.fold(len(topo.gpus)),
                                      self.thresholds, self.interval, taken)
        yield "snapshot: scores"
        published = yield from self._warm_and_publish(snap, prev)
        done = "publish"
        for fn in self._listeners if published else ():
            yield done
            done = f"listener {getattr(fn, '__qualname__', type(fn).__name__)}"
            for _ in fn(snap, prev) or ():
                yield done
        yield done
        return snap

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Refresh every cadence: on this refresher's own thread, or, given `loop`, on that
        event loop, a slice of steps per callback (restarts a refresher already running)."""
        if loop is None and self._thread is not None and self._thread.is_alive():
            return
        self.stop()
        self._stop.clear()
        if loop is not None:
            self._run += 1
            run = self._run
            loop.call_soon_threadsafe(lambda: self._loop_tick(loop, run, loop.time()))
            return
        self._thread = threading.Thread(target=self._run_thread, name="placer-refresher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop refreshing; a loop-driven refresh half-way is dropped unpublished."""
        self._run += 1
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> "Refresher":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run_thread(self) -> None:
        prio, cpus = self._rt
        if prio is not None or cpus:
            self.realtime = apply_realtime(prio, cpus)
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick(None)
            except Exception as e:  # a failing source must not kill the collector; the snapshot goes stale and says so
                self.errors.append(f"{type(e).__name__}: {e}")
            next_at += self.cadence
            delay = next_at - time.monotonic()
            if delay < 0:
                self.overruns += 1
                next_at = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def _loop_tick(self, loop: asyncio.AbstractEventLoop, run: int, due: float) -> None:
        if run == self._run:
            self._loop_step(loop, run, due, self._begin())

    def _loop_step(self, loop: asyncio.AbstractEventLoop, run: int, due: float, r: _Refresh) -> None:
        """Run a slice of steps, then let the loop serve before the next: steps back to
        back, even with the loop polling between them, would take half its time for the
        length of a refresh and queue the requests behind. The steps take `share()` of the
        loop's time, so a refresh is spread over `SPREAD` of the cadence: a few
        milliseconds of work at a quarter of the loop each tick was a burst that a loop
        serving at 70 % queued behind (`benchmarks/serve.py`, paced). A slice is the steps
        that fit in `SLICE` (at least one): a measured tick's few short steps in one
        callback, not one wake-up of the loop each."""
        if run != self._run:
            r.steps.close()
            return
        took: float | None = 0.0
        try:
            while took is not None and took < SLICE:  # steps back to back up to a slice: each callback is a wake-up of the loop
                step = self._step(r)
                took = None if step is None else took + step
        except Exception as e:  # as on the thread: the snapshot goes stale and says so
            self.errors.append(f"{type(e).__name__}: {e}")
            took = None
        if took is not None:
            loop.call_later(took * (1 / self.share(r.full) - 1), self._loop_step, loop, run, due, r)
            return
        due += self.cadence
        now = loop.time()
        if due < now:
            self.overruns += 1
            due = now
        loop.call_at(due, self._loop_tick, loop, run, due)
