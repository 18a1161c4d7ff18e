"""The shape shared by the signals that read one measured gauge of a model server per GPU
(running requests, KV-cache use, ...): each GPU's value of one key of the frame's readings
(`readings.Reading`, from the metrics scraper), its age, and what the signal makes of a
fresh value: a refusal over a bound and seconds added to the predicted queueing.

A reading older than `max_age_s` (or than `readings.STALE_TICKS` of its source's tick, when
that is longer: a scraper's fleet budget), or whose value is not a usable figure (NaN, negative, or
out of the gauge's range), is stale and never used: `OnStale.FALL_BACK` leaves the term out
and the plan says so; `OnStale.EXCLUDE` refuses the GPU naming the reading's age. A GPU
with no reading is left to the model. A subclass (one file under `signals/`) declares its
key, its words and `terms(value)`; the reference reads candidate by candidate, the column
scatters every reading onto the topology's rows once per readings and settings."""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import ClassVar, Mapping

import numpy as np

from .framework import NOTHING, Column, OnStale, Signal, Stage, TickInputs, Words
from .readings import Reading, Readings, age_limit, gpu_columns, on_tick
from .snapshot import Snapshot
from .topology import Topology


class GaugeSignal(Signal[TickInputs]):
    """One measured gauge per GPU; see the module's docstring."""

    stage = Stage.TICK
    key: ClassVar[str]  # the measured key read (`server_metric_names`)
    what: ClassVar[str]  # the gauge in words ("running requests")
    top: ClassVar[float] = math.inf  # the largest usable value (a fraction: 1)

    def __init__(self, *, bound: float, max_age_s: float, on_stale: OnStale) -> None:
        if not (bound >= 0 and max_age_s > 0):
            raise ValueError(f"{self.name} signal: bound {bound!r} must be non-negative and max_age_s {max_age_s!r} positive")
        self.bound = bound
        self.max_age_s = max_age_s
        self.on_stale = OnStale(on_stale)
        self._last: tuple[Readings, Topology, tuple, Column] | None = None

    @abstractmethod
    def terms(self, value: np.ndarray) -> np.ndarray:
        """Seconds a fresh `value` adds to the predicted queueing (vectorised)."""

    def value(self, values: Mapping[str, float]) -> float | None:
        """The gauge from a reading's values (None: the reading has none); by default the
        value of `key`, a subclass may derive it (a histogram's mean from its sum and count)."""
        return values.get(self.key)

    def settings(self) -> tuple:
        """What the column depends on besides the readings (a subclass adds its own)."""
        return (self.bound, self.max_age_s, self.on_stale)

    def show(self, value: float) -> str:
        return f"{value:g}"

    def _columns(self, value: np.ndarray, age: np.ndarray, present: np.ndarray, limit: np.ndarray) -> Column:
        with np.errstate(invalid="ignore"):
            usable = (value >= 0) & (value <= self.top) & np.isfinite(value)
            stale = present & (~(age <= limit) | ~usable)
        fresh = present & ~stale
        fail = fresh & (value > self.bound)
        if self.on_stale is OnStale.EXCLUDE:
            fail = fail | stale
        latency = np.where(fresh, self.terms(np.where(fresh, value, 0.0)), 0.0)
        return Column(fail=fail, latency=latency, stale=stale if self.on_stale is OnStale.FALL_BACK else None)

    def reference(self, x: TickInputs) -> Column:
        """Candidate by candidate: its GPU's reading, by key."""
        measured = x.snap.frame.measured
        if not measured:
            return NOTHING
        t = x.snap.topology
        gpus = np.arange(len(t.gpus))[x.gpus].tolist()
        value, age, present = np.full(len(gpus), np.nan), np.full(len(gpus), np.nan), np.zeros(len(gpus), dtype=bool)
        limit = np.full(len(gpus), np.nan)
        for i, g in enumerate(gpus):
            got = self._get(measured.get(t.gpu_key(g)))
            if got is not None:
                (value[i], age[i], limit[i]), present[i] = got, True
        return self._columns(value, age, present, limit)

    def column(self, x: TickInputs) -> Column:
        """Every GPU at once: the readings scattered onto the topology's rows, once per
        readings and settings (every path table of a tick shares it)."""
        measured = x.snap.frame.measured
        if not measured:
            return NOTHING
        last, settings = self._last, self.settings()
        if last is not None and last[0] is measured and last[1] is x.snap.topology and last[2] == settings:
            col = last[3]
        else:
            t = x.snap.topology
            value, age, present = gpu_columns(measured, t, lambda r: self.value(r.values))
            limit, _, _ = gpu_columns(measured, t, lambda r: None if self.value(r.values) is None
                                      else age_limit(self.max_age_s, r.tick_s))
            col = self._columns(value, age, present, limit)
            self._last = (measured, t, settings, col)  # one assignment: a racing build makes the same column
        return col if isinstance(x.gpus, slice) else col.at(x.gpus)

    def detail(self, w: Words, r: int) -> str:
        g = int(w.ev.gpus[r])
        got = self._get(w.snap.frame.measured.get(w.snap.topology.gpu_key(g)))
        if got is None:
            return f"no {self.what} reading"
        value, age, limit = got
        if self._stale(value, age, limit):
            return (f"{self.what} reading {self.show(value)}, {age:.2f} s old: older than {limit:g} s or "
                    f"unusable, excluded as stale")
        return f"{self.what} {self.show(value)} > {self.show(self.bound)}"

    def plan_note(self, snap: Snapshot, gpu: int) -> str | None:
        got = self._get(snap.frame.measured.get(snap.topology.gpu_key(gpu)))
        if got is None:
            return None
        value, age, limit = got
        where = snap.topology.gpu_key(gpu)
        if self._stale(value, age, limit):
            return (f"{self.what} of {where} is stale ({self.show(value)}, {age:.2f} s old, bound {limit:g} s): "
                    f"left out of the prediction")
        extra = float(self.terms(np.array([value]))[0])
        tick = on_tick(snap.frame.measured.get(where))
        return f"{self.what} of {where}: {self.show(value)}, measured {age * 1e3:.0f} ms ago{tick} (+{extra * 1e3:.2f} ms queueing)"

    def _get(self, reading: Reading | None) -> tuple[float, float, float] | None:
        """(value, age, age limit at its source's tick) of a reading that gives the gauge, else None."""
        if reading is None:
            return None
        v = self.value(reading.values)
        return None if v is None else (float(v), float(reading.age_s), age_limit(self.max_age_s, reading.tick_s))

    def _stale(self, value: float, age: float, limit: float) -> bool:
        return not (age <= limit) or not (0 <= value <= self.top and math.isfinite(value))


__all__ = ["GaugeSignal"]
