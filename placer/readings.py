"""Measured state: per GPU, the values its model server reports (by metric key) and how old
they are. The same shape as the metrics scraper's `snapshot(endpoint)` (`Reading(values,
age_s)`), so the scraper or any other source (the gateway's own per-call timings, a test)
can feed the placer's signals (`framework.py`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, NamedTuple


class Reading(NamedTuple):
    """One endpoint's measured values (metric key -> value) and their age in seconds when
    the telemetry frame was sampled."""

    values: Mapping[str, float]
    age_s: float


Readings = Mapping[str, Reading]  # per GPU key (`host/gpuN`: the GPU the endpoint's server runs on)
NO_READINGS: Readings = MappingProxyType({})

__all__ = ["NO_READINGS", "Reading", "Readings"]
