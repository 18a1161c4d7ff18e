"""A whole gateway next to a running decision service, in one call: the endpoint picker on
the decision server's event loop, the Envoy bootstrap with the pool from a file Envoy
watches (file-based EDS), Envoy itself, and a task that rewrites that file whenever the
registered pool changes (an instance registered with an endpoint takes traffic within
about `SYNC_INTERVAL` seconds, one deregistered stops receiving any).

The picker only forwards to endpoints Envoy already has (`EndpointPicker.published`): an
endpoint Envoy did not know would make its override-host balancer fall back to its own
choice, which is never policyc's.

Envoy sends its access log to policyc's receiver (unless the user names an ALS sink of
their own): the picker learns from it which requests Envoy broke and retried and when each
request ended, so Envoy consults the picker once per call; with an audit log, each call
also gets its accounting record from it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable
from policyc.enforcer.rule_table import RuleTable, build_rule_table
from policyc.server.app import ServerThread

from policyc.audit.records import ActionRecord as AuditAction
from policyc.enforcer.backup_choice import quarantine_targets
from policyc.enforcer.data_path import DataPath, DataPathConfig, is_attachable
from policyc.enforcer.signal_windows import GatewaySignals, KernelStreamSignals, SignalWindows, TelemetryLevels
from policyc.server.node_rebalance import NodeRebalance
from policyc.compiler.actions import REDIRECT

from policyc.audit.cgroup_cpu import CgroupCpuMeter
from policyc.audit.nvml_process import open_nvml

from .access_log import AccessLogReceiver, AccessLogServer
from .bootstrap import POOL_CLUSTER, GatewaySpec, build_bootstrap, eds_document
from .envoy_process import EnvoyError, EnvoyProcess
from .limits import Limits
from .llm_side import LlmOptions, LlmSide
from .picker import PickerConfig
from .server import UNIX_PATH_MAX, PickerServer

log = logging.getLogger("policyc.gateway")
SYNC_INTERVAL = 0.1  # seconds between looks at the pool


class WorkdirBusy(EnvoyError):
    """Another running gateway holds the working directory."""


@dataclass(frozen=True)
class GatewayOptions:
    listen: str = "127.0.0.1:8080"
    admin: str = "127.0.0.1:9901"
    picker_host: str = "127.0.0.1"
    picker_port: int = 0  # 0: ephemeral
    failure_mode_allow: bool = False
    max_in_flight: int = 512
    concurrency: int = 1  # Envoy worker threads (one worker: one upstream connection per model server)
    forwarded_headers: frozenset[str] = frozenset()
    access_log_cluster: str | None = None  # an ALS sink of the user's own (`ip:port`); None: policyc's receiver
    accounting: bool = True  # with an audit log: policyc receives Envoy's access log, one accounting record per call
    kernel_data_path: bool = True  # with the kernel plane loaded: TC on `interfaces`, connect hooks on Envoy's cgroup
    interfaces: tuple[str, ...] = ("lo",)
    cgroup: Path | None = None  # None: a cgroup of the gateway's own under the cgroup2 mount
    tls_cert: Path | None = None  # with tls_key: clients connect over TLS
    tls_key: Path | None = None
    workdir: Path | None = None  # where the bootstrap, the EDS file and Envoy's log go (default: a temp dir)
    limits: Limits = Limits()  # what one client may hold of the gateway (gateway/limits.py)
    log_level: str = "warning"
    llm: LlmOptions | None = LlmOptions()  # the LLM routes, bodies and streams (gateway/llm_side.py); None: off
    otlp_endpoint: str | None = None  # an OTLP/gRPC collector: Envoy's and the picker's spans go there (gateway/tracing.py)
    otlp_sampling: float = 100.0  # percent of requests without a client's sampling decision that are traced


def retry_budget(table: RuleTable) -> float | None:
    """The tightest `retry_budget` among the breakers that redirect (Envoy's cluster-wide
    retry budget: the share of active requests that may be retries)."""
    shares = [b.breaker.retry_budget for b in table.budgets if any(a.kind == REDIRECT for a in b.breaker.actions)]
    return min(shares) if shares else None


class Gateway:
    """`start()` → self (Envoy ready, the picker serving, the pool synced); `stop()`."""

    def __init__(self, thread: ServerThread, options: GatewayOptions = GatewayOptions()) -> None:
        self.thread = thread
        self.options = options
        self.workdir = Path(options.workdir) if options.workdir else Path(tempfile.mkdtemp(prefix="policyc-gateway-"))
        self.eds_path = self.workdir / "pool.json"
        sock = str(self.workdir / "picker.sock")  # Envoy reaches the picker here: cheaper than TCP loopback
        self.picker = PickerServer(thread.server, PickerConfig(host=options.picker_host, port=options.picker_port,
                                                                max_in_flight=options.max_in_flight,
                                                                max_headers_count=options.limits.max_headers_count,
                                                                max_header_bytes=options.limits.max_header_bytes,
                                                                forwarded_headers=options.forwarded_headers,
                                                                # its own Envoy sends request headers only when the
                                                                # picker follows policyc's access-log receiver
                                                                headers_only=options.access_log_cluster is None,
                                                                unix_socket=sock if len(sock.encode()) <= UNIX_PATH_MAX
                                                                else None))
        # the LLM routes: bodies read with the models' tokenizers, answers supervised (gateway/llm_side.py)
        self.llm = LlmSide(thread, self.picker, self.workdir, options.llm) if options.llm is not None else None
        if options.otlp_endpoint is not None:  # opt-in: each pick's spans, children of Envoy's (gateway/tracing.py)
            from .tracing import PickerTracer

            self.picker.picker.tracer = PickerTracer(options.otlp_endpoint)
        self.envoy: EnvoyProcess | None = None
        self._task: asyncio.Task[None] | None = None
        self._written: tuple[str, ...] | None = None
        self._version = 0
        audit = thread.server.audit
        self.access_log: AccessLogServer | None = None
        accounting = options.accounting and audit is not None
        if options.access_log_cluster is None:
            # policyc's receiver: the picker learns breaks and request ends from it (so Envoy asks
            # it nothing about answers); with an audit log, one accounting record per call too,
            # handed over with the bridge's next batch of decisions (one commit for both)
            sink = audit.accounting_body if accounting and audit is not None else None
            self.access_log = AccessLogServer(AccessLogReceiver(None, every_attempt=False, body_sink=sink), options.picker_host
                                              if options.picker_host not in ("0.0.0.0", "::") else "127.0.0.1")
            self.picker.picker.follow_access_log(self.access_log.receiver)
            if sink is not None:  # each call's CPU from its serving process's cgroup (audit/cgroup_cpu.py)
                meter = CgroupCpuMeter(gpu=open_nvml())  # GPU-seconds per process where NVML is
                if meter.available:
                    self.access_log.receiver.cpu = meter.start()
        self._als: str | None = options.access_log_cluster
        self.signals: SignalWindows | None = None  # the gateway's cross-layer signals, 10 ms windows, to the guardian
        g = thread.server.guardian
        if self.access_log is not None and accounting and g is not None:
            self.signals = SignalWindows(lambda w: g.observe_gpu(w.key, w.signals))
            self.access_log.receiver.listeners.append(GatewaySignals(self.signals, self._gpu_of))
        self.telemetry_levels: TelemetryLevels | None = None  # NVML's SM utilisation into the windows
        if self.signals is not None and thread.server.cluster is None:  # measured telemetry (--telemetry local) only
            pool = self.picker.picker.pool
            self.telemetry_levels = TelemetryLevels(self.signals, lambda: (m.gpu_key for m in pool.members()))
            thread.server.refresher.on_refresh(self.telemetry_levels)
        self.data_path: DataPath | None = None  # the decision service's (server.kernel_path), or ...
        self._own_data_path: DataPath | None = None  # ... the gateway's own when the service attached none
        self.kernel_streams: KernelStreamSignals | None = None
        self._unsubscribe_streams: Callable[[], object] | None = None
        self._unlink_rebalance: Callable[[], None] | None = None
        self._lock: IO[str] | None = None  # `gateway.lock` in the workdir, held while running

    def spec(self, picker_port: int) -> GatewaySpec:
        o = self.options
        g = self.thread.server.guardian
        table = g.table if g is not None else build_rule_table(self.thread.server.engine.state.bundle)
        sock = self.picker.config.unix_socket
        return GatewaySpec(picker=f"unix:{sock}" if sock is not None else
                           f"{o.picker_host if o.picker_host not in ('0.0.0.0', '::') else '127.0.0.1'}:{picker_port}",
                           listen=o.listen, admin=o.admin, eds_path=str(self.eds_path),
                           failure_mode_allow=o.failure_mode_allow, retry_budget=retry_budget(table),
                           access_log_cluster=self._als, breaks_from_access_log=self.access_log is not None,
                           # without accounting, the log carries only the calls that can break, for the picker
                           log_every_call=self.access_log is None or self.access_log.receiver.records,
                           # policyc's receiver reads the answering attempt from the call's entry
                           log_every_attempt=self.access_log is None,
                           tls_cert=str(o.tls_cert) if o.tls_cert else None,
                           tls_key=str(o.tls_key) if o.tls_key else None, limits=o.limits,
                           llm=self.llm.routes if self.llm is not None else None, otlp_endpoint=o.otlp_endpoint,
                           otlp_sampling=o.otlp_sampling)

    def _lock_workdir(self) -> None:
        """Hold `gateway.lock` in the working directory while running (the kernel lets go when
        this process dies, however): two gateways never share one directory, so an Envoy its
        pid file names there is a leftover, which `EnvoyProcess.start` may stop."""
        path = self.workdir / "gateway.lock"
        lock = open(path, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            who = lock.read().strip() or "another process"
            lock.close()
            raise WorkdirBusy(f"{self.workdir}: this gateway directory is in use by {who}; stop that gateway or "
                              "give another --workdir / --state-dir") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}\n")
        lock.flush()
        self._lock = lock

    def _write_pool(self, endpoints: tuple[str, ...]) -> None:
        self._version += 1
        tmp = self.eds_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(eds_document(endpoints, str(self._version))))
        os.replace(tmp, self.eds_path)  # atomic: Envoy watches for the move
        if self.llm is not None:
            self.llm.write_pool(endpoints, str(self._version))
        self._written = endpoints

    def _reserve_ports(self, picker_port: int) -> None:
        """The gateway's own ports are never an instance's endpoint: registered there, Envoy
        would proxy clients to its own admin API (server/endpoint_rules.py)."""
        rules = self.thread.server.service.endpoints
        rules.reserve(picker_port, "the gateway's endpoint picker")
        for what, addr in (("Envoy's listener", self.options.listen), ("Envoy's admin interface", self.options.admin),
                           ("the gateway's access-log receiver", self._als or "")):
            port = addr.rpartition(":")[2]
            if port.isdigit():
                rules.reserve(int(port), what)

    def start(self, timeout: float = 20.0) -> "Gateway":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._lock_workdir()
        port = self.thread.call(self.picker.start())
        if self.access_log is not None:
            self._als = self.thread.call(self.access_log.start())
        self._reserve_ports(port)
        if self.llm is not None:
            self.llm.start()
        endpoints = self.picker.picker.pool.endpoints()
        self._write_pool(endpoints)
        self.bootstrap = build_bootstrap(self.spec(port))
        self.envoy = EnvoyProcess(self.bootstrap, self.workdir, concurrency=self.options.concurrency,
                                  log_level=self.options.log_level).start(timeout)
        self._attach_data_path()
        self._link_rebalance()
        self._publish(endpoints, timeout)
        self._task = self.thread.call(self._start_sync())
        return self

    def byte_agreement(self) -> dict[str, tuple[int, int]]:
        """Per model server: (TCP payload bytes the kernel plane's TC counted toward it, upstream
        wire bytes Envoy's access log reported sending it) since the plane was attached."""
        g, dp = self.thread.server.guardian, self.data_path
        if g is None or dp is None or self.access_log is None:
            return {}
        out = {}
        for backend in dp.backends():
            bid = g.backend_id(backend)
            if bid is not None:
                kernel = g.plane.backend_counters(bid, "egress", True).payload  # type: ignore[attr-defined]
                out[str(backend)] = (int(kernel), self.access_log.receiver.sent_by_host.get(str(backend), 0))
        return out

    def _record_agreement(self) -> None:
        """At stop: the kernel/Envoy byte agreement per model server, into the audit log."""
        audit, figures = self.thread.server.audit, self.byte_agreement()
        if audit is None or not figures:
            return
        detail = json.dumps({ep: {"kernel_payload": k, "envoy_upstream_wire": e, "ratio": round(k / e, 4) if e else None}
                             for ep, (k, e) in figures.items()}, sort_keys=True)
        try:
            audit.log.submit_action(AuditAction(time=time.time(), kind="accounting", target="kernel cross-check",
                                                outcome="done", dry_run=False, detail=detail))
        except Exception as e:  # noqa: BLE001 - said, never fatal at stop
            log.error("gateway: the byte agreement could not be recorded: %s", e)

    def _gpu_of(self, instance_id: str) -> str | None:
        try:
            d = self.thread.server.engine.state.registry.get(instance_id).deployment
        except Exception:  # noqa: BLE001 - deregistered since it answered
            return None
        return f"{d.host}/{d.gpu}"

    def _attach_data_path(self) -> None:
        """With the kernel plane loaded (`--enforcer kernel`), put it on Envoy's path."""
        g = self.thread.server.guardian
        if not self.options.kernel_data_path or g is None or not is_attachable(g.plane):
            return
        assert self.envoy is not None and self.envoy.pid is not None
        owner = self.thread.server.kernel_path
        if owner is not None:  # the decision service put the plane on the data path: Envoy joins its cgroup
            self.data_path = owner.data_path
            if self.data_path.cgroup is None:  # detached since (a benchmark's detached rounds): on again
                self.data_path.attach()
        else:
            self.data_path = self._own_data_path = DataPath(g, DataPathConfig(self.options.interfaces,
                                                                             self.options.cgroup)).attach()
        self.data_path.adopt(self.envoy.pid)
        self._sync_backends()
        if self.signals is not None:  # the TC walker's per-stream HTTP/2 times into the same windows
            self.kernel_streams = KernelStreamSignals(self.signals, self._gpu_of_endpoint)
            self._unsubscribe_streams = g.plane.subscribe(self.kernel_streams)  # type: ignore[attr-defined]

    def _link_rebalance(self) -> None:
        """Self-heal's rebalance drains a node by waiting for this gateway's picks to it that
        have not ended (the picker's open requests)."""
        g = self.thread.server.guardian
        hook = g.executor.rebalance if g is not None else None
        if isinstance(hook, NodeRebalance):
            self._unlink_rebalance = hook.link_in_flight(self.in_flight_to)

    def in_flight_to(self, endpoints: frozenset[str]) -> int:
        """Requests picked onto one of `endpoints` whose ext_proc stream has not ended."""
        return sum(1 for pick, _ in tuple(self.picker.picker._open.values()) if pick.endpoint in endpoints)

    def _gpu_of_endpoint(self, endpoint: str) -> str | None:
        m = next((m for m in self.picker.picker.pool.members() if m.endpoint == endpoint), None)
        return m.gpu_key if m is not None else None

    def _sync_backends(self) -> None:
        """Each pool endpoint with its quarantine target: a backup the picker would retry on
        (the decision service's data path, when it owns the attachment, follows its registry)."""
        if self._own_data_path is None:
            return
        g = self.thread.server.guardian
        assert g is not None
        self._own_data_path.sync(quarantine_targets(g.table, self.picker.picker.pool))

    async def _start_sync(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._sync(), name="policyc-gateway-pool")

    def _publish(self, endpoints: tuple[str, ...], timeout: float = 5.0) -> None:
        """Wait until Envoy holds every endpoint (admin `/clusters`), then let the picker use them."""
        assert self.envoy is not None
        deadline = time.monotonic() + timeout
        want = set(endpoints)
        while time.monotonic() < deadline:
            if want <= self.envoy.cluster_hosts(POOL_CLUSTER):
                break
            time.sleep(0.02)
        else:
            log.warning("envoy has not loaded the pool %s within %.1f s", sorted(want), timeout)
        self.picker.picker.pool.published = frozenset(endpoints)

    async def _sync(self) -> None:
        pool = self.picker.picker.pool
        while True:
            await asyncio.sleep(SYNC_INTERVAL)
            try:
                if self.signals is not None:
                    await asyncio.to_thread(self.signals.flush, time.time())
                endpoints = pool.endpoints()
                if endpoints != self._written:
                    removed = set(self._written or ()) - set(endpoints)
                    if removed:  # stop picking them before Envoy forgets them
                        self.picker.picker.pool.published = frozenset(endpoints)
                    await asyncio.to_thread(self._write_pool, endpoints)
                    await asyncio.to_thread(self._publish, endpoints)
                    await asyncio.to_thread(self._sync_backends)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep syncing; say what failed
                log.exception("gateway: pool sync failed")

    def stop(self) -> None:
        task = self._task
        if task is not None:
            self.thread.loop.call_soon_threadsafe(task.cancel)
            self._task = None
        if self.envoy is not None:
            if self.access_log is not None:
                self._settle_access_log()
            self.envoy.stop()
        tracer = self.picker.picker.tracer
        if tracer is not None:  # the last spans out (Envoy's went with it)
            tracer.shutdown()
            self.picker.picker.tracer = None
        if self._unlink_rebalance is not None:
            self._unlink_rebalance()
            self._unlink_rebalance = None
        if self._unsubscribe_streams is not None:
            self._unsubscribe_streams()
            self._unsubscribe_streams = None
        if self.telemetry_levels is not None:
            self.telemetry_levels.closed = True
        if self.data_path is not None:
            self._record_agreement()
            if self._own_data_path is not None:
                self._own_data_path.detach()  # the service's own is detached when the service stops
                self._own_data_path = None
            self.data_path = None
        if self.access_log is not None:
            try:
                self.thread.call(self.access_log.stop())
            except RuntimeError:  # the server's loop is already gone
                pass
        try:
            self.thread.call(self.picker.stop())
        except RuntimeError:  # the server's loop is already gone
            pass
        if self.llm is not None:
            try:
                self.llm.stop()
            except RuntimeError:  # the server's loop is already gone
                pass
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _settle_access_log(self, quiet: float = 0.3, timeout: float = 3.0) -> None:
        """Before Envoy stops: wait until its access log has been quiet for `quiet` seconds
        (it flushes every `GatewaySpec.access_log_flush_ms`), so the last calls' entries are not lost with it."""
        assert self.access_log is not None
        counts, deadline = self.access_log.receiver.counts, time.monotonic() + timeout
        seen, since = counts.entries, time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - since < quiet:
            time.sleep(0.05)
            if counts.entries != seen:
                seen, since = counts.entries, time.monotonic()

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
