"""Feeding measured state to the placer: a telemetry source whose frames carry the model
servers' own readings (`readings.Reading` per GPU key), so the signals that consume them
(`signals/queue_depth.py`, ...) see them once per tick with their ages.

Readings come from any callable returning them per GPU key; `by_endpoint` adapts a source
keyed by endpoint (the metrics scraper's `snapshot(endpoint) -> Reading(values, age_s)`)
through the registry's endpoint -> GPU map (`endpoint_gpus`)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Protocol

from policyc.matcher.instance import Instance

from .readings import Reading, Readings
from .telemetry import TelemetryFrame, TelemetrySource
from .topology import Topology


class Measured(Protocol):
    """What an endpoint source answers: values by key and their age (`Reading`, or the
    metrics scraper's `EndpointReading`)."""

    @property
    def values(self) -> Mapping[str, float]: ...

    @property
    def age_s(self) -> float: ...


class WithReadings:
    """`source`'s topology and frames, each frame carrying `readings()` taken as it is
    sampled (a read-only copy: a later change of the source's own map is the next tick's)."""

    def __init__(self, source: TelemetrySource, readings: Callable[[], Readings]) -> None:
        self.name = f"{source.name}+measured"
        self._source = source
        self._readings = readings

    def topology(self) -> Topology:
        return self._source.topology()

    def sample(self) -> TelemetryFrame:
        frame = self._source.sample()
        return dataclasses.replace(frame, measured=MappingProxyType(dict(self._readings())))


def endpoint_gpus(instances: Iterable[Instance]) -> dict[str, str]:
    """Each registered endpoint's GPU key (`host/gpuN`), from the instances that have one."""
    return {i.deployment.endpoint: f"{i.deployment.host}/{i.deployment.gpu}" for i in instances if i.deployment.endpoint}


def by_endpoint(snapshot: Callable[[str], Measured | None], gpus: Callable[[], Mapping[str, str]]) -> Callable[[], Readings]:
    """Readings per GPU key from a source keyed by endpoint: `snapshot(endpoint)` (None: no
    reading yet) for each endpoint of `gpus()` (endpoint -> GPU key, read each tick: the
    registry changes)."""

    def readings() -> Readings:
        out: dict[str, Reading] = {}
        for endpoint, gpu in gpus().items():
            got = snapshot(endpoint)
            if got is not None:
                out[gpu] = Reading(got.values, got.age_s)
        return out

    return readings


__all__ = ["WithReadings", "by_endpoint", "endpoint_gpus"]
