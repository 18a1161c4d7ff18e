"""Queue depth: the requests waiting at the model server on a GPU, as the server itself
reports them (vLLM's `vllm:num_requests_waiting`, scraped from its `/metrics`, or the
gateway's own count), under the measured key `queue_depth`.

Each waiting request ahead of this one adds `seconds_per_request` to the predicted queueing
(by default the placer's GPU quantum: the latency model's wait is the mean number queued
times that quantum, `latency.gpu_queue`, and here the number queued is measured instead of
modelled); a GPU whose queue is deeper than `max_depth` is refused (no bound by default:
the queue only scores). A reading older than `max_age_s` (or, when its source's tick is
longer, `readings.STALE_TICKS` of that tick: a scraper's fleet budget) is stale and never used: with
`OnStale.FALL_BACK` (the default) its term is left out and the plan says so; with
`OnStale.EXCLUDE` the GPU is refused, naming the reading's age. A GPU with no reading (no
server measured there, or no metrics source configured) is left to the model, as before
measured state existed; a reading that is not a number of requests (NaN, negative) counts
as stale.

This file and its line in `signals/__init__.py` are the whole of the signal: the runners
fold its column into their tables (`framework.py`)."""

from __future__ import annotations

import math

import numpy as np

from ..framework import NOTHING, Column, OnStale, Reading, Readings, Signal, Stage, TickInputs, Words
from ..latency import GPU_QUANTUM
from ..plan import Constraint
from ..readings import age_limit, gpu_columns, on_tick
from ..snapshot import Snapshot
from ..topology import Topology

KEY = "queue_depth"


class QueueDepth(Signal[TickInputs]):
    name = "queue_depth"
    constraint = Constraint.QUEUE_DEPTH
    consumes = (KEY,)
    stage = Stage.TICK

    def __init__(self, *, max_depth: float = math.inf, seconds_per_request: float = GPU_QUANTUM, max_age_s: float = 0.25,
                 on_stale: OnStale = OnStale.FALL_BACK) -> None:
        if not (max_depth >= 0 and seconds_per_request >= 0 and max_age_s > 0):
            raise ValueError(f"queue depth signal: max_depth {max_depth!r}, seconds_per_request {seconds_per_request!r} "
                             f"and max_age_s {max_age_s!r} must be non-negative (the age bound positive)")
        self.max_depth = max_depth
        self.seconds_per_request = seconds_per_request
        self.max_age_s = max_age_s
        self.on_stale = OnStale(on_stale)
        self._last: tuple[Readings, Topology, tuple, Column] | None = None  # the latest readings' column

    def _columns(self, depth: np.ndarray, age: np.ndarray, measured: np.ndarray, limit: np.ndarray) -> Column:
        """From each GPU's depth, age and age limit where `measured`: the refusals, the seconds, the stale."""
        stale = measured & (~(age <= limit) | ~(depth >= 0) | ~np.isfinite(depth))
        fresh = measured & ~stale
        fail = fresh & (depth > self.max_depth)
        if self.on_stale is OnStale.EXCLUDE:
            fail = fail | stale
        latency = np.where(fresh, depth * self.seconds_per_request, 0.0)
        return Column(fail=fail, latency=latency, stale=stale if self.on_stale is OnStale.FALL_BACK else None)

    def reference(self, x: TickInputs) -> Column:
        """Candidate by candidate: its GPU's reading, by key."""
        measured = x.snap.frame.measured
        if not measured:
            return NOTHING
        t = x.snap.topology
        gpus = np.arange(len(t.gpus))[x.gpus].tolist()
        depth, age, present = np.full(len(gpus), np.nan), np.full(len(gpus), np.nan), np.zeros(len(gpus), dtype=bool)
        limit = np.full(len(gpus), np.nan)
        for i, g in enumerate(gpus):
            got = _depth(measured.get(t.gpu_key(g)), self.max_age_s)
            if got is not None:
                (depth[i], age[i], limit[i]), present[i] = got, True
        return self._columns(depth, age, present, limit)

    def column(self, x: TickInputs) -> Column:
        """Every GPU at once: the readings scattered onto the topology's rows (one pass over
        the readings, once per tick)."""
        measured = x.snap.frame.measured
        if not measured:
            return NOTHING
        last = self._last  # the column depends on the readings and settings alone: once per tick, for every path table
        settings = (self.max_depth, self.seconds_per_request, self.max_age_s, self.on_stale)
        if last is not None and last[0] is measured and last[1] is x.snap.topology and last[2] == settings:
            col = last[3]
            return col if isinstance(x.gpus, slice) else col.at(x.gpus)
        t = x.snap.topology
        depth, age, present = gpu_columns(measured, t, lambda r: r.values.get(KEY))
        limit, _, _ = gpu_columns(measured, t, lambda r: age_limit(self.max_age_s, r.tick_s) if KEY in r.values else None)
        col = self._columns(depth, age, present, limit)
        self._last = (measured, t, settings, col)  # one assignment: a racing build makes the same column
        return col if isinstance(x.gpus, slice) else col.at(x.gpus)

    def detail(self, w: Words, r: int) -> str:
        g = int(w.ev.gpus[r])
        got = _depth(w.snap.frame.measured.get(w.snap.topology.gpu_key(g)), self.max_age_s)
        if got is None:
            return "no queue depth reading"
        depth, age, limit = got
        if _stale(depth, age, limit):
            return f"queue depth reading {_what(depth, age)}: older than {limit:g} s or unusable, excluded as stale"
        return f"queue depth {depth:g} > {self.max_depth:g} waiting requests"

    def plan_note(self, snap: Snapshot, gpu: int) -> str | None:
        got = _depth(snap.frame.measured.get(snap.topology.gpu_key(gpu)), self.max_age_s)
        if got is None:
            return None
        depth, age, limit = got
        if not _stale(depth, age, limit):  # the measured queue the prediction used, named
            tick = on_tick(snap.frame.measured.get(snap.topology.gpu_key(gpu)))
            return (f"queue depth of {snap.topology.gpu_key(gpu)}: {depth:g} waiting, measured {age * 1e3:.0f} ms ago{tick} "
                    f"(+{depth * self.seconds_per_request * 1e3:.1f} ms queueing)")
        return (f"queue depth of {snap.topology.gpu_key(gpu)} is stale ({_what(depth, age)}, bound {limit:g} s): "
                f"left out of the prediction, the modelled queue stands")


def _stale(depth: float, age: float, limit: float) -> bool:
    return not (age <= limit) or not (0 <= depth < math.inf)


def _depth(reading: Reading | None, max_age_s: float) -> tuple[float, float, float] | None:
    """(depth, age, age limit at its source's tick) of a reading that has a queue depth, else None."""
    if reading is None:
        return None
    v = reading.values.get(KEY)
    return None if v is None else (float(v), float(reading.age_s), age_limit(max_age_s, reading.tick_s))


def _what(depth: float, age: float) -> str:
    return f"{depth:g} waiting, {age:.2f} s old"
