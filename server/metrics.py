"""Prometheus metrics of the decision service, on a registry of its own (so several servers
in one process, as in tests, do not collide): decisions by outcome and reason, decision
latency by stage, registry size, topology staleness, RPC errors by status."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from .decision import Decision

_BUCKETS = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter("policyc_decisions", "Decisions by outcome and reason", ["outcome", "reason"], registry=r)
        self.latency = Histogram("policyc_decision_seconds", "Decision latency inside the server", ["stage"],
                                 buckets=_BUCKETS, registry=r)
        self.errors = Counter("policyc_rpc_errors", "RPCs refused, by method and status", ["method", "status"], registry=r)
        self.registry_size = Gauge("policyc_registry_instances", "Registered model instances", registry=r)
        self.staleness = Gauge("policyc_topology_staleness_seconds", "Age of the topology snapshot", registry=r)
        self.reloads = Counter("policyc_bundle_reloads", "Bundle reloads by result", ["result"], registry=r)
        self.bundle = Gauge("policyc_bundle_info", "The bundle in use (value 1)", ["hash"], registry=r)
        self._lat_total = self.latency.labels("total")
        self._lat_stage = {s: self.latency.labels(s) for s in ("parse", "feasibility", "match", "place")}
        self._by_reason: dict[tuple[str, str], object] = {}

    def observe(self, d: Decision) -> None:
        reason = "ok" if d.rejection is None else (d.rejection.binding or d.rejection.stage.value)
        key = (d.outcome.value, reason)
        c = self._by_reason.get(key)
        if c is None:
            c = self._by_reason[key] = self.decisions.labels(*key)
        c.inc()  # type: ignore[attr-defined]
        t = d.timing
        self._lat_total.observe(t.total)
        for name, v in t.stages().items():
            if v:
                self._lat_stage[name].observe(v)

    def set_bundle(self, old: str | None, new: str) -> None:
        if old:
            self.bundle.remove(old)
        self.bundle.labels(new).set(1)

    def watch(self, registry_size: Callable[[], int], staleness: Callable[[], float]) -> None:
        self.registry_size.set_function(registry_size)
        self.staleness.set_function(staleness)

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
