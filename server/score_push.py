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

The push is a listener of the refresher that returns its steps (`steps`): each chooses
the next GPUs due and pushes them as one `Registry.set_gpu_scores` batch (the engine's
`push_scores`) of at most `chunk` group moves. Where the refresher runs on the serving event loop (the
server's default), each chunk is one of its paced loop callbacks and queues between
requests; on the refresher's own thread they run back to back.
"""

from __future__ import annotations

from typing import Iterator, Protocol

import numpy as np

from policyc.placer import Snapshot

# group moves per tick: ~1 ms of the serving loop per tick at 100,000 instances. 256 kept the
# ranking closer to the placer (drift p99 0.070 against 0.095) but read a paced p99 ~25 %
# higher (benchmarks/RESULTS.md, serve, seventh pass)
DEFAULT_BUDGET = 128
MIN_DELTA = 0.05
# group moves per step: ~0.1 ms of CPU at 20,000 instances (a group move ~10 us, the step's
# choosing included); 32 a step was 0.42 ms median, 1.1 ms at most, each holding the serving loop
DEFAULT_CHUNK = 8


class ScoreSink(Protocol):
    def groups_on(self, host: str, gpu: str) -> int: ...

    def push_scores(self, changes: list[tuple[str, str, float]]) -> int: ...


class ScorePusher:
    """`ScorePusher(engine, budget=128)`; register `pusher.steps` with the refresher."""

    def __init__(self, sink: ScoreSink, *, budget: int = DEFAULT_BUDGET, min_delta: float = MIN_DELTA,
                 chunk: int = DEFAULT_CHUNK) -> None:
        if budget < 1:
            raise ValueError(f"score push budget must be at least 1 group move per tick, got {budget}")
        if chunk < 1:
            raise ValueError(f"score push chunk must be at least 1 group move, got {chunk}")
        self.chunk = chunk
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

    def steps(self, snap: Snapshot, previous: Snapshot | None = None) -> Iterator[int]:
        """This tick's share of score changes, a chunk per step: each step takes the next
        GPUs due, largest move first, until `chunk` group moves, pushes them as one batch
        and yields the moves; the tick ends when `budget` moves are spent (`sum(steps(...))`
        pushes the whole share at once)."""
        t = snap.topology
        if self._topology is not t:
            self._topology = t
            self._pushed = np.full(len(t.gpus), np.nan)  # a new structure: everything is due
        delta = np.abs(snap.scores - self._pushed)
        delta[np.isnan(delta)] = np.inf
        due = np.flatnonzero(delta >= self.min_delta)
        order = due[np.argsort(-delta[due], kind="stable")].tolist()
        self.deferred = len(order)
        part: list[tuple[str, str, float]] = []
        marked: list[int] = []  # GPUs of `part`: pushed once their batch has landed
        spent = in_part = 0
        for i in order:
            g = t.gpus[i]
            host, gpu = t.hosts[g.host].name, g.gpu_id
            n = self._sink.groups_on(host, gpu)
            if n and spent and spent + n > self.budget:
                break
            if n and in_part and in_part + n > self.chunk:
                yield self._push(snap, part, marked)
                part, marked, in_part = [], [], 0
            if n:
                part.append((host, gpu, float(snap.scores[i])))
                marked.append(i)
                spent += n
                in_part += n
            else:  # no instance on it: nothing to move, nothing owed
                self._pushed[i] = snap.scores[i]
            self.deferred -= 1
        if part:
            yield self._push(snap, part, marked)

    def _push(self, snap: Snapshot, part: list[tuple[str, str, float]], gpus: list[int]) -> int:
        moved = self._sink.push_scores(part)
        self._pushed[gpus] = snap.scores[gpus]
        return moved


__all__ = ["DEFAULT_BUDGET", "DEFAULT_CHUNK", "MIN_DELTA", "ScorePusher", "ScoreSink"]
