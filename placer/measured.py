"""Feeding measured state to the placer: a telemetry source whose frames carry the model
servers' own readings (`readings.Reading` per GPU key), so the signals that consume them
(`signals/queue_depth.py`, ...) see them once per tick with their ages.

Readings come from any callable returning them per GPU key; `by_endpoint` adapts a source
keyed by endpoint (the metrics scraper's `snapshot(endpoint) -> Reading(values, age_s)`)
through the registry's endpoint -> GPU map (`endpoint_gpus`). `ScrapedFleet` is the running
service's wiring: the metrics scraper following the registry, its readings per GPU key."""

from __future__ import annotations

import dataclasses
import logging
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Protocol

from policyc.matcher.instance import Instance

from .metrics_scraper import METRICS_LABEL
from .readings import NO_READINGS, Reading, Readings
from .server_metric_names import combine
from .telemetry import TelemetryFrame, TelemetrySource
from .topology import Topology

if TYPE_CHECKING:
    from policyc.matcher.registry import Registry

    from .metrics_scraper import MetricsScraper

log = logging.getLogger("policyc.placer.measured")


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
        return self.remeasure(self._source.sample())

    def remeasure(self, frame: TelemetryFrame) -> TelemetryFrame:
        """`frame` with the readings as they are now: the refresher's measured tick between
        two samples of the source (the model servers' readings change on the scrape's clock,
        the fabric's telemetry on its own; `refresher.Refresher`, `measured_interval`)."""
        return dataclasses.replace(frame, measured=MappingProxyType(dict(self._readings())))


def endpoint_gpus(instances: Iterable[Instance]) -> dict[str, str]:
    """Each registered endpoint's GPU key (`host/gpuN`), from the instances that have one."""
    return {i.deployment.endpoint: f"{i.deployment.host}/{i.deployment.gpu}" for i in instances if i.deployment.endpoint}


def by_endpoint(snapshot: Callable[[str], Measured | None], gpus: Callable[[], Mapping[str, str]]) -> Callable[[], Readings]:
    """Readings per GPU key from a source keyed by endpoint: `snapshot(endpoint)` (None: no
    reading yet) for each endpoint of `gpus()` (endpoint -> GPU key, read each tick: the
    registry changes).

    Several servers on one GPU (copies of a model there, each its own engine) make one
    reading: their requests waiting and running summed, the fullest cache taken
    (`server_metric_names.combine`), as old as the oldest of them: the GPU's signals judge
    one reading, and any one server's alone (an idle copy's zero) would hide the queue of
    the copy that serves."""

    def readings() -> Readings:
        out: dict[str, Reading] = {}
        more: dict[str, list[Reading]] = {}
        for endpoint, gpu in gpus().items():
            got = snapshot(endpoint)
            if got is None:
                continue
            r = Reading(got.values, got.age_s, getattr(got, "tick_s", 0.0))  # the tick in use travels with the age
            if gpu in out:
                more.setdefault(gpu, [out[gpu]]).append(r)
            out[gpu] = r
        for gpu, rs in more.items():
            out[gpu] = Reading(combine([r.values for r in rs]), max(r.age_s for r in rs), max(r.tick_s for r in rs))
        return out

    return readings




class ScrapedFleet:
    """The metrics scraper kept on a registry's endpoints, and its readings per GPU key for
    `WithReadings`: the wiring of a running decision service (`server/app.py`).

    `readings()` is the refresher's (called once per tick, where the frame is sampled): when
    the registry changed since the last tick (another registry, or its index's membership
    version moved) it makes the scraper follow the routable instances that carry a `metrics`
    label (their server kind: `metrics_scraper.METRICS_LABEL`) and remaps endpoints to GPU
    keys; then it reads each endpoint's latest scrape with its age (`by_endpoint`). Before
    `start()` and after `stop()` there are no readings (the placer's model stands)."""

    def __init__(self, scraper: "MetricsScraper", registry: "Callable[[], Registry | None]") -> None:
        self.scraper = scraper
        self._registry = registry
        self._seen: tuple[int, int, int] | None = None  # (registry, index, membership version) last followed
        self._gpus: dict[str, str] = {}
        self._by = by_endpoint(scraper.snapshot, lambda: self._gpus)
        self._on = False

    def start(self) -> "ScrapedFleet":
        self.scraper.start()
        self._on = True
        return self

    def stop(self) -> None:
        self._on = False
        self.scraper.stop()

    def readings(self) -> Readings:
        if not self._on:
            return NO_READINGS
        reg = self._registry()
        if reg is None:
            return NO_READINGS
        ix = reg.index
        seen = (id(reg), id(ix), ix.version)
        if seen != self._seen:
            routable = reg.routable()
            scraped = [i for i in routable if i.labels.get(METRICS_LABEL)]
            try:
                self.scraper.follow(scraped)
            except ValueError as e:  # an endpoint the scraper cannot parse: the others are still followed next time
                log.warning("metrics scraper: %s", e)
            self._gpus = endpoint_gpus(scraped)
            self._seen = seen
        return self._by()


__all__ = ["ScrapedFleet", "WithReadings", "by_endpoint", "endpoint_gpus"]
