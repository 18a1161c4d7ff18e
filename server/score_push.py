"""Feed the placer's per-GPU scores to the matcher's ranking, within a budget per tick.

The matcher ranks best-k candidates by score; the placer then chooses among them on the
live snapshot, so a score only has to be roughly right, and its biggest moves (a GPU
that collapsed or whose port congested drops to 0) matter most. A push moves the GPU's
(model, GPU) groups in the matcher's ranking (`Registry.set_gpu_scores`): one move per
model on the GPU, whatever the number of copies (it was one update per instance, ~50 per
GPU at 100,000 instances, before the matcher ranked groups). Pushing every change is
still not free: simulated telemetry moves ~10 % of GPU scores by 0.05 every tick, and
each group move is several microseconds of Python on the thread that serves decisions.

So each tick pushes the GPUs whose score moved most since it was last *pushed* (not
since the previous tick: small drifts add up and are pushed once they matter), largest
move first, until `budget` group moves are spent; the rest wait for a later tick.

Where the moves run: inline on the refresher thread by default, or, once `run_on(loop's
call_soon_threadsafe)` is given (the server does), as callbacks of at most `chunk` group
moves on the event loop that serves decisions. From another thread the push holds the
interpreter lock for milliseconds per tick, and the loop thread, wanting it back, waits up
to the switch interval (5 ms by default) at each hand-over: when every copy was moved, that
showed as paced calls over 5 ms overlapping pushes. On the loop a chunk simply queues
between requests. Since pushes move groups (~2 ms a tick) the two places measure within
the noise of each other (`benchmarks/RESULTS.md`, serve, sixth pass); the loop is kept.
Each chunk is one `Registry.set_gpu_scores` batch (the engine's `push_scores`): one lock
pair and one vectorised tier lookup per chunk.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Protocol

import numpy as np

from policyc.placer import Snapshot

DEFAULT_BUDGET = 256  # group moves per tick (~2 ms per tick at 100,000 instances; see benchmarks/RESULTS.md, serve)
MIN_DELTA = 0.05
DEFAULT_CHUNK = 32  # group moves per event-loop callback (~0.3 ms)


class ScoreSink(Protocol):
    def groups_on(self, host: str, gpu: str) -> int: ...

    def push_scores(self, changes: list[tuple[str, str, float]]) -> int: ...


class ScorePusher:
    """`ScorePusher(engine, budget=256)`; register `pusher.on_refresh` with the refresher."""

    def __init__(self, sink: ScoreSink, *, budget: int = DEFAULT_BUDGET, min_delta: float = MIN_DELTA,
                 chunk: int = DEFAULT_CHUNK) -> None:
        if budget < 1:
            raise ValueError(f"score push budget must be at least 1 group move per tick, got {budget}")
        if chunk < 1:
            raise ValueError(f"score push chunk must be at least 1 group move, got {chunk}")
        self.chunk = chunk
        self._run_on: Callable[[Callable[[], None]], object] | None = None
        self.dropped = 0  # chunks never run (the loop had stopped)
        self._sink = sink
        self.budget = budget
        self.min_delta = min_delta
        self._topology: object | None = None
        self._pushed = np.zeros(0)
        self.deferred = 0  # GPUs left for a later tick by the last push
        self._spans: deque[tuple[float, float]] = deque(maxlen=1024)  # ~25 s of ticks, pushed in chunks

    def baseline(self, snap: Snapshot) -> None:
        """Take `snap`'s scores as what the matcher already holds (instances registered
        with the score of the snapshot current at registration)."""
        self._topology = snap.topology
        self._pushed = np.array(snap.scores, dtype=np.float64)

    def run_on(self, schedule: Callable[[Callable[[], None]], object] | None) -> None:
        """Run the updates through `schedule` (e.g. `loop.call_soon_threadsafe`), a chunk
        per call; None: inline on the thread that calls `on_refresh`."""
        self._run_on = schedule

    def spans(self) -> tuple[tuple[float, float], ...]:
        """(start, end) `time.perf_counter` of the recent pushes, as `Refresher.spans()`
        gives for ticks: to tell whether a slow decision overlapped one."""
        return tuple(self._spans)

    def on_refresh(self, snap: Snapshot, previous: Snapshot | None = None) -> int:
        """Push this tick's share of score changes; returns the group moves made (or,
        when they run on the loop, scheduled)."""
        t0 = time.perf_counter()
        try:
            return self._push(snap)
        finally:
            self._spans.append((t0, time.perf_counter()))

    def _push(self, snap: Snapshot) -> int:
        t = snap.topology
        if self._topology is not t:
            self._topology = t
            self._pushed = np.full(len(t.gpus), np.nan)  # a new structure: everything is due
        delta = np.abs(snap.scores - self._pushed)
        delta[np.isnan(delta)] = np.inf
        due = np.flatnonzero(delta >= self.min_delta)
        if not len(due):
            self.deferred = 0
            return 0
        order = due[np.argsort(-delta[due], kind="stable")]
        changes: list[tuple[str, str, float]] = []
        spent = 0
        done = 0
        for i in order.tolist():
            g = t.gpus[i]
            host, gpu = t.hosts[g.host].name, g.gpu_id
            n = self._sink.groups_on(host, gpu)
            if n and spent and spent + n > self.budget:
                break
            score = float(snap.scores[i])
            if n:
                changes.append((host, gpu, score))
                spent += n
            self._pushed[i] = score
            done += 1
        self.deferred = len(order) - done
        if not changes:
            return 0
        schedule = self._run_on
        if schedule is None:
            return self._sink.push_scores(changes)
        self._schedule(schedule, self._chunks(changes))
        return spent

    def _schedule(self, schedule: Callable[[Callable[[], None]], object], parts: list[list[tuple[str, str, float]]]) -> None:
        """Run `parts` one callback at a time, each scheduling the next when it is done, so
        that the loop polls for requests between two chunks (callbacks queued together
        would all run in one loop iteration)."""
        try:
            schedule(lambda: self._push_chunk(schedule, parts))
        except RuntimeError:  # the loop is closed: the server is stopping
            self.dropped += len(parts)

    def _chunks(self, changes: list[tuple[str, str, float]]) -> list[list[tuple[str, str, float]]]:
        out: list[list[tuple[str, str, float]]] = [[]]
        n = 0
        for c in changes:
            k = self._sink.groups_on(c[0], c[1])
            if out[-1] and n + k > self.chunk:
                out.append([])
                n = 0
            out[-1].append(c)
            n += k
        return out

    def _push_chunk(self, schedule: Callable[[Callable[[], None]], object], parts: list[list[tuple[str, str, float]]]) -> None:
        t0 = time.perf_counter()
        self._sink.push_scores(parts[0])
        self._spans.append((t0, time.perf_counter()))
        if len(parts) > 1:
            self._schedule(schedule, parts[1:])


__all__ = ["DEFAULT_BUDGET", "DEFAULT_CHUNK", "MIN_DELTA", "ScorePusher", "ScoreSink"]
