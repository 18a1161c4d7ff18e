"""Measured state: per GPU, the values its model server reports (by metric key) and how old
they are. The same shape as the metrics scraper's `snapshot(endpoint)` (`Reading(values,
age_s)`), so the scraper or any other source (the gateway's own per-call timings, a test)
can feed the placer's signals (`framework.py`)."""

from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from .topology import Topology


class Reading(NamedTuple):
    """One endpoint's measured values (metric key -> value) and their age in seconds when
    the telemetry frame was sampled."""

    values: Mapping[str, float]
    age_s: float
    tick_s: float = 0.0  # the tick its source reads it on (the scraper's, stretched by its fleet budget); 0: none


STALE_TICKS = 5  # a periodic reading is stale after this many of its source's ticks (and never before a signal's own bound)


def age_limit(max_age_s: float, tick_s: float) -> float:
    """The age past which a reading is stale for a signal whose own bound is `max_age_s`: that
    bound, or STALE_TICKS of the tick the source actually reads it on when that is longer (a
    scraper's fleet budget stretches its tick; the budget alone never makes a reading stale)."""
    return max(max_age_s, STALE_TICKS * tick_s)


def on_tick(reading: Reading | None) -> str:
    """" on a 160 ms tick": the tick a periodic reading was read on, for a plan's line ("": none)."""
    return f" on a {reading.tick_s * 1e3:.0f} ms tick" if reading is not None and reading.tick_s > 0 else ""


def fresh(reading: Reading, max_age_s: float) -> bool:
    """Whether `reading` is within its age limit (`age_limit`) for a signal bound of `max_age_s`."""
    return reading.age_s <= age_limit(max_age_s, reading.tick_s)


Readings = Mapping[str, Reading]  # per GPU key (`host/gpuN`: the GPU the endpoint's server runs on)
NO_READINGS: Readings = MappingProxyType({})



@lru_cache(maxsize=4)
def _rows(topology: Topology) -> dict[str, int]:
    """Each GPU key's row in the topology (a reading's key is a GPU key)."""
    return {k: i for i, k in enumerate(topology.gpu_keys)}


def gpu_columns(readings: Readings, topology: Topology,
                value_of: Callable[[Reading], float | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One measured value per GPU row of the topology: (value, age in seconds, present),
    NaN and False where no reading of the GPU gives one; what every gauge-like signal's
    per-tick column starts from."""
    index = _rows(topology)
    n = len(topology.gpus)
    value, age, present = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool)
    got = [(row, v, r.age_s) for k, r in readings.items()
           if (row := index.get(k)) is not None and (v := value_of(r)) is not None]
    if got:
        rows, values, ages = zip(*got)
        at = np.array(rows, dtype=np.int64)
        value[at] = np.array(values, dtype=np.float64)
        age[at] = np.array(ages, dtype=np.float64)
        present[at] = True
    return value, age, present


__all__ = ["NO_READINGS", "Reading", "Readings", "STALE_TICKS", "age_limit", "fresh", "gpu_columns", "on_tick"]
