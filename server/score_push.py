"""Feed the placer's per-GPU scores to the matcher's ranking, within a budget per tick.

The matcher ranks best-k candidates by score; the placer then chooses among them on the
live snapshot, so a score only has to be roughly right, and its biggest moves (a GPU
that collapsed or whose port congested drops to 0) matter most. Pushing every change
is not affordable: each instance update is ~15-30 µs of Python under the registry's
locks, run on the refresher thread while holding the GIL, and simulated telemetry moves
~10 % of GPU scores by 0.05 every tick. With 100,000 instances (~50 per GPU) that was
~9,000 updates, 0.2-0.4 s of GIL per 200 ms tick: the refresher overran and every
decision in flight waited behind it.

So each tick pushes the GPUs whose score moved most since it was last *pushed* (not
since the previous tick: small drifts add up and are pushed once they matter), largest
move first, until `budget` instance updates are spent; the rest wait for a later tick.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from policyc.placer import Snapshot

DEFAULT_BUDGET = 512  # instance score updates per tick (~10 ms of Python at most)
MIN_DELTA = 0.05


class ScoreSink(Protocol):
    def instances_on(self, host: str, gpu: str) -> int: ...

    def push_scores(self, changes: list[tuple[str, str, float]]) -> int: ...


class ScorePusher:
    """`ScorePusher(engine, budget=512)`; register `pusher.on_refresh` with the refresher."""

    def __init__(self, sink: ScoreSink, *, budget: int = DEFAULT_BUDGET, min_delta: float = MIN_DELTA) -> None:
        if budget < 1:
            raise ValueError(f"score push budget must be at least 1 instance update per tick, got {budget}")
        self._sink = sink
        self.budget = budget
        self.min_delta = min_delta
        self._topology: object | None = None
        self._pushed = np.zeros(0)
        self.deferred = 0  # GPUs left for a later tick by the last push

    def baseline(self, snap: Snapshot) -> None:
        """Take `snap`'s scores as what the matcher already holds (instances registered
        with the score of the snapshot current at registration)."""
        self._topology = snap.topology
        self._pushed = np.array(snap.scores, dtype=np.float64)

    def on_refresh(self, snap: Snapshot, previous: Snapshot | None = None) -> int:
        """Push this tick's share of score changes; returns the instance updates made."""
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
            n = self._sink.instances_on(host, gpu)
            if n and spent and spent + n > self.budget:
                break
            score = float(snap.scores[i])
            if n:
                changes.append((host, gpu, score))
                spent += n
            self._pushed[i] = score
            done += 1
        self.deferred = len(order) - done
        return self._sink.push_scores(changes) if changes else 0


__all__ = ["DEFAULT_BUDGET", "MIN_DELTA", "ScorePusher", "ScoreSink"]
