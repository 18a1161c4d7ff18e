"""Prometheus metrics of the decision service, on a registry of its own (so several servers
in one process, as in tests, do not collide): decisions by outcome and reason, decision
latency (total, and by stage apart), per-RPC counts and latency, registry size, topology
staleness, RPC errors by status, the enforcer's actions and quarantines."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from .decision import Decision
from .decision_counters import DecisionCounters
from .rpc_metrics import EnforcerSeries, RpcCounters


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = DecisionCounters()  # per-decision figures: plain counters, collected at scrape time
        r.register(self.decisions)
        self.rpcs = RpcCounters()  # per-RPC counts and latency, collected at scrape time
        r.register(self.rpcs)
        self.errors = Counter("policyc_rpc_errors", "RPCs refused, by method and status", ["method", "status"], registry=r)
        self.registry_size = Gauge("policyc_registry_instances", "Registered model instances", registry=r)
        self.staleness = Gauge("policyc_topology_staleness_seconds", "Age of the topology snapshot", registry=r)
        self.reloads = Counter("policyc_bundle_reloads", "Bundle reloads by result", ["result"], registry=r)
        self.bundle = Gauge("policyc_bundle_info", "The bundle in use (value 1)", ["hash"], registry=r)

    def observe(self, d: Decision) -> None:
        self.decisions.observe(d)

    def set_bundle(self, old: str | None, new: str) -> None:
        if old:
            self.bundle.remove(old)
        self.bundle.labels(new).set(1)

    def watch(self, registry_size: Callable[[], int], staleness: Callable[[], float]) -> None:
        self.registry_size.set_function(registry_size)
        self.staleness.set_function(staleness)

    def watch_enforcer(self, records: list, active_streams: Callable[[], int],  # type: ignore[type-arg]
                       attached_programs: Callable[[], int]) -> None:
        """Expose the enforcer's series (its action sink's records, its active streams, the
        BPF programs its plane has attached)."""
        self.registry.register(EnforcerSeries(records, active_streams, attached_programs))

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
