"""The decision server assembled: bundle → state → engine; cluster telemetry → refresher →
placer; guardian (enforcer) with its anomaly sink on the placer and its actions in the
audit log; the gRPC service with health checking and reflection.

`DecisionServer(bundle, config)`: `await start()` → bound port, `await stop()`.
`ServerThread` runs one on a private event loop for synchronous callers (tests, the demo).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import warnings
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection

from policyc.audit.log import AuditLog
from policyc.compiler.bundle import Bundle
from policyc.placer import Placer, Refresher, SimulatedCluster, TelemetrySource
from policyc.placer.catalog import catalog_for
from policyc.placer.measured import ScrapedFleet, WithReadings
from policyc.placer.metrics_scraper import MetricsScraper

from .audit_bridge import AuditBridge
from .audit_metrics import AuditCollector
from . import operator_token
from .auth import Access, Role
from .endpoint_rules import EndpointRules, parse_networks
from .config import EnforcerMode, ServeConfig, Telemetry
from .engine import DecisionEngine
from .event_loop import new_event_loop
from .metrics import Metrics
from .generic_handlers import add_health, add_reflection
from .handlers import add_decisions_service
from .heap import HeapSettler
from .kernel_path import KernelPath, kernel_plane_loaded
from .proto import SERVICE_NAME
from .readiness import Readiness
from .score_push import ScorePusher
from .bundle_verifier import BundleVerifier
from .service import DecisionService
from .state import PolicyState, build_state
from .transport import bind
from .wiring import GpuWatch, make_guardian

log = logging.getLogger("policyc.server")


class DecisionServer:
    def __init__(self, bundle: Bundle, config: ServeConfig = ServeConfig()) -> None:
        self.config = config
        self.metrics = Metrics()
        if config.telemetry is Telemetry.SIMULATED:
            c = config.cluster
            cluster = SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack)
            self.cluster: SimulatedCluster | None = cluster
            source: TelemetrySource = cluster
        else:
            from policyc.placer import LocalHostSource, NvmlSource

            self.cluster = None
            source = LocalHostSource(nvml=NvmlSource())
        self.scraped: ScrapedFleet | None = None  # the model servers' own metrics, started with the service
        if config.metrics_scrape_interval is not None:
            scraper = MetricsScraper(config.metrics_scrape_interval, max_scrapes_per_s=config.metrics_scrape_budget)
            self.scraped = ScrapedFleet(scraper, lambda: self.engine.state.registry)
            source = WithReadings(source, self.scraped.readings)
        # the scraped readings on the scrape's clock, the rest of the telemetry on the refresh's
        self.refresher = Refresher(source, config.refresh_interval, measured_interval=config.metrics_scrape_interval)
        self.refresher.tick()
        self.placer = Placer(self.refresher, catalog_for(bundle.gpu_catalog))  # replaced on every reload (engine.reload)
        state = build_state(bundle)
        snap = self.refresher.current

        def score_of(host: str, gpu: str) -> float | None:
            s = snap()
            return s.gpu_score(host, gpu) if (host, gpu) in s.topology.gpu_index else None

        self.replica = None  # a replica of a cluster (policyc.cluster) when the config names a fleet store
        engine_cls, engine_placer = DecisionEngine, self.placer
        if config.fleet is not None:
            from policyc.cluster.serving import replica_parts

            self.replica, engine_placer, engine_cls = replica_parts(config.fleet, self, self.placer)  # type: ignore[assignment]
        self.engine = engine_cls(state, engine_placer, candidates=config.candidates, score_of=score_of,  # type: ignore[arg-type]
                                 score_lag=config.refresh_interval)  # rankings trail score pushes by a tick at most
        self.scores = ScorePusher(self.engine, budget=config.score_push_budget)
        self.scores.baseline(self.refresher.current())
        self.refresher.on_refresh(self.scores.steps)
        self.heap = HeapSettler(self.engine) if config.settle_heap else None
        if self.heap is not None:
            self.refresher.on_refresh(self.heap)
        self.audit: AuditBridge | None = None
        if config.audit_log is not None:
            self.audit = AuditBridge(AuditLog.open(config.audit_log, signing_key=config.audit_key, warm=True), bundle,
                                     durability=config.audit_durability, window=config.audit_window)
            self.metrics.registry.register(AuditCollector(self.audit))
        self.guardian = None
        self.actions = None
        if config.enforcer is not EnforcerMode.OFF:
            self.guardian, self.actions = make_guardian(bundle, config.enforcer, self.placer, self.audit,
                                                        self_heal=config.self_heal, engine=self.engine,
                                                        slots=lambda: self.refresher.current().topology.gpu_slots())
            if self.replica is not None:
                self.guardian.set_fence(self.replica)  # self-heal and quarantine: the elected leader only
            self.engine.on_reload(lambda st: self.guardian.load_bundle(st.bundle))  # type: ignore[union-attr]
            plane = self.guardian.plane
            self.metrics.watch_enforcer(self.actions.memory.records, self.guardian.active,
                                        lambda: plane.attached_programs() if hasattr(plane, "attached_programs") else 0)
            if config.watch_gpus:
                self.gpu_watch = GpuWatch(self.guardian)
                self.refresher.on_refresh(self.gpu_watch.on_refresh)
        self.kernel_path: KernelPath | None = None  # the kernel plane on the data path, from start() to stop()
        self._kernel_path_series = False  # its Prometheus series, registered once it first attaches
        self.metrics.set_bundle(None, bundle.content_hash)
        self.metrics.watch(lambda: len(self.engine.state.registry), lambda: self.refresher.current().age())
        self.service = DecisionService(self.engine, self.metrics, config.tokens, audit=self.audit,
                                       max_decide_bytes=config.max_decide_bytes,
                                       verifier=BundleVerifier(config.bundle_key))
        self.service.topology = lambda: self.refresher.current().topology
        self.service.endpoints = EndpointRules(parse_networks(config.endpoint_networks), host_addresses=config.host_addresses)
        # who may call what (made at start: the operator token of a throw-away service is
        # keyed by its bound port); `operator_token` is the operator's, for the CLI and tests
        self.access: Access | None = None
        self.operator: operator_token.OperatorToken | None = None
        self.health = health.aio.HealthServicer()
        self.readiness = Readiness(self.health, ("", SERVICE_NAME), interval=min(0.5, max(config.refresh_interval, 0.05)))
        self.readiness.add("bundle", lambda: None if self.engine.state.bundle_hash else "no bundle loaded")
        self.readiness.add("topology", self._topology_fresh)
        self.readiness.add("registry", lambda: None if len(self.engine.state.registry) >= config.ready_min_instances
                           else f"{len(self.engine.state.registry)} of {config.ready_min_instances} instances registered")
        if self.audit is not None:  # the audit log fails closed: not ready while it refuses decisions
            self.readiness.add("audit", self.audit.refusal)
            self.audit.watch(self._audit_gate_changed)
        self._server: grpc.aio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None

    def start_refresher(self) -> None:
        """(Re)start the refresher where the configuration puts it: on the serving loop,
        or on its own thread."""
        if self._loop is None:
            raise RuntimeError("the server has not been started: no event loop yet")
        self.refresher.start(self._loop if self.config.refresh_on_loop else None)

    def _audit_gate_changed(self, why: str | None) -> None:
        """The audit gate opened or closed (on the bridge's threads): re-evaluate readiness
        now rather than at the next interval, so health follows the gate at once."""
        loop = self._loop
        if loop is not None and self._server is not None:
            try:
                asyncio.run_coroutine_threadsafe(self.readiness.update(), loop)
            except RuntimeError:  # the loop has closed
                pass

    def _topology_fresh(self) -> str | None:
        """Fresh: younger than five refresh intervals (2 s at least) while the refresher runs;
        a test stepping the cluster by hand (no refresher) owns the clock."""
        age = self.refresher.current().age()
        limit = max(5 * self.config.refresh_interval, 2.0)
        if self.config.start_refresher and age > limit:
            return f"snapshot is {age:.1f} s old (limit {limit:.1f} s)"
        return None

    @property
    def state(self) -> PolicyState:
        return self.engine.state

    async def start(self) -> int:
        opts = [("grpc.max_receive_message_length", self.config.max_message_bytes),
                ("grpc.max_send_message_length", self.config.max_message_bytes),
                ("grpc.so_reuseport", 0)]
        server = grpc.aio.server(options=opts)
        await asyncio.to_thread(self._attach_data_path)  # off the loop: pyroute2 runs a loop of its own
        try:
            self.port = bind(server, self.config)
            self.access = self._access(self.port)
            add_decisions_service(self.service, server, self.access)
            add_health(self.health, server)  # generic handlers only: see generic_handlers.py
            add_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
            self.service.endpoints.reserve(self.port, "the decision API")
            self.service.endpoints.reserve(self.config.metrics_port, "the metrics endpoint")
            if self.replica is not None:  # join before serving: the fleet and the bundle in force first
                await self.replica.start(f"{self.config.host}:{self.port}")
            await server.start()
        except BaseException:
            await asyncio.to_thread(self._detach_data_path)  # BPF attachments outlive the process: never leave them
            if self.operator is not None:
                self.operator.remove()
            raise
        self._server = server
        for name in ("", SERVICE_NAME):  # NOT_SERVING until every readiness check passes
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._loop = asyncio.get_running_loop()
        if self.scraped is not None:
            self.scraped.start()
        if self.config.start_refresher:
            if self._topology_fresh() is not None:
                self.refresher.tick()  # built long before start(): a fresh snapshot first
            self.start_refresher()
        await self.readiness.start()
        if self.config.metrics_port is not None:
            self.metrics.serve(self.config.metrics_port, self.config.metrics_host or self.config.host)
        return self.port

    @property
    def operator_token(self) -> str | None:
        """The operator's token (the one the service made, or the first `operator:` given)."""
        return self.operator.token if self.operator is not None else None

    def _access(self, port: int) -> Access:
        """Who may call what: the configured tokens, plus the operator token the service
        makes and keeps when none is given (`operator_token.py`); with `open_fleet`, every
        caller is an operator, said loudly."""
        cfg = self.config
        tokens = cfg.tokens
        given = next((t for t, r in tokens.roles.items() if r is Role.OPERATOR), None)
        if cfg.open_fleet:
            log.warning("--open-fleet: every caller that reaches %s:%d may register and deregister instances and "
                        "reload the bundle, without a token (any process of any user on this machine)", cfg.host, port)
        elif given is not None:
            self.operator = operator_token.OperatorToken(given, None)
        else:
            self.operator = operator_token.kept(cfg.token_dir).published(port) if cfg.token_dir is not None \
                else operator_token.ephemeral(port)
            tokens = tokens.with_token(self.operator.token, Role.OPERATOR)
        return Access.build(tokens, open_fleet=cfg.open_fleet)

    def _attach_data_path(self) -> None:
        """With the kernel plane loaded, put it on the data path (`config.data_path`). Under
        `--enforcer kernel` a failure is the start's (DataPathError, fail closed); under
        `auto` it is said loudly and audited, and the service runs with the plane loaded but
        attached to nothing, as the user-space fallback does."""
        cfg = self.config
        if cfg.data_path is None or not kernel_plane_loaded(self.guardian):
            return
        assert self.guardian is not None and self.actions is not None
        try:
            self.kernel_path = KernelPath(self.guardian, self.engine, cfg.data_path).start()
            if not self._kernel_path_series:
                from .kernel_path_metrics import KernelPathSeries

                self.metrics.registry.register(KernelPathSeries(lambda: self.kernel_path))
                self._kernel_path_series = True
        except Exception as e:
            if cfg.enforcer is EnforcerMode.KERNEL:
                raise
            from policyc.enforcer.records import ActionKind, ActionRecord, Outcome

            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            log.warning("the kernel plane is loaded but NOT on the data path (--enforcer auto): %s", why)
            self.actions(ActionRecord(time=time.time(), kind=ActionKind.CLASSIFY, target="data_path", rule="",
                                      outcome=Outcome.FAILED, detail=f"the kernel plane is not on the data path: {why}",
                                      source="kernel"))

    def _detach_data_path(self) -> None:
        if self.kernel_path is not None:
            self.kernel_path.stop()
            self.kernel_path = None

    async def reload_path(self, path: str | Path, source: str = "SIGHUP") -> tuple[str, tuple[str, ...]]:
        """Reload from a file through the service's one verifier (read off the loop)."""
        return await self.service.reload_path(str(path), source=source)

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()

    async def stop(self, grace: float = 1.0) -> None:
        """Stop answering (NOT_SERVING first, so balancers drain), then the threads, then
        flush the audit log."""
        self.readiness.stop()
        if self._server is not None:
            await self.health.enter_graceful_shutdown()
            await self._server.stop(grace)
            self._server = None
        if self.replica is not None:
            await self.replica.stop()
        self.refresher.stop()
        if self.scraped is not None:
            self.scraped.stop()
        self.engine.state.feasibility.close()  # its solver thread ends once the queued shapes are solved
        if self.heap is not None:
            self.heap.release()
        await asyncio.to_thread(self._detach_data_path)
        if self.guardian is not None:
            self.guardian.close()
        if self.audit is not None:
            self.audit.close()
        if self.operator is not None:
            self.operator.remove()  # a throw-away service's token file (a kept one stays)


class Serving(Protocol):
    """A server an event loop runs: `start()` → its port, `stop()`."""

    async def start(self) -> int: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Serving)


class ServerThread(Generic[S]):
    """A server (a DecisionServer; any `Serving`) on its own event loop in a
    daemon thread: `start()` → port; `stop()`; `call(coro)` runs a coroutine on the server's
    loop (e.g. a reload)."""

    def __init__(self, server: S, name: str = "policyc-server") -> None:
        self.server = server
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def start(self, timeout: float = 30.0) -> int:
        self._thread.start()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout)

    @property
    def native_id(self) -> int | None:
        """The OS id of the thread running the event loop (per-thread CPU figures)."""
        return self._thread.native_id

    def call(self, coro, timeout: float = 120.0):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        self.call(self.server.stop(), timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self.loop.close()

    def __enter__(self) -> "ServerThread[S]":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
