"""policyc's receiver for Envoy's gRPC access-log service (`envoy.service.accesslog.v3`):
what the data plane measured about every call, turned into one `accounting` audit record
per call, joined to its decision by the decision id the picker put on the request.

Envoy sends two logs here (`bootstrap._access_log`): the connection manager's, one entry
per downstream call (log name `policyc`), and the router's upstream log, one entry per
attempt (log name `policyc_upstream`), so a call that broke and was retried on the backup
has both attempts. An attempt carries the bytes Envoy wrote and read on the upstream
connection for it (wire bytes, HTTP/2 framing included), its times, the host that served
it, its gRPC status and the model server's own compute time (the `x-policyc-compute-us`
header its answer carries: the record's `compute_seconds`, not GPU-seconds). The call is
recorded once its downstream entry and as many attempts as Envoy says it made have
arrived (the two logs are separate streams, flushed on their own timers), or after `GRACE`
seconds with what did arrive (the record says which attempts are missing).

policyc's own gateway has the router log only the attempts Envoy broke (`GatewaySpec.
log_every_attempt` off, `every_attempt=False` here): the answering attempt is read from the
call's own entry, which carries the last upstream's host, wire bytes (that attempt's alone,
not a sum over retries: checked with a real Envoy), headers, status and times. One entry per
unbroken call instead of two halves Envoy's and policyc's work per call (issue 20).

Nothing here estimates: the figures are Envoy's and the model server's, labelled
`measured` with their source.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import grpc
import msgspec
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from policyc.audit.accounting import call_accounting, call_accounting_body
from policyc.audit.cgroup_cpu import CgroupCpuMeter
from policyc.audit.records import ActionRecord, Figure, Source

from .bootstrap import DECISION_HEADER, TLS_HANDSHAKE_HEADER, TRACEPARENT, UPSTREAM_CONNECT_HEADER, UPSTREAM_CONNECTION_HEADER

log = logging.getLogger("policyc.gateway.access_log")

DOWNSTREAM_LOG = "policyc"
UPSTREAM_LOG = "policyc_upstream"
COMPUTE_HEADER = "x-policyc-compute-us"
INSTANCE_HEADER = "x-policyc-instance"
VARIANT_HEADER = "x-policyc-variant"
GRPC_STATUS = "grpc-status"
GRACE = 1.0  # seconds a call waits for attempts Envoy has not flushed yet
CPU_HOLD = 0.5  # seconds a record waits for the calls that overlapped it before its cgroup CPU is apportioned
ORPHAN_AFTER = 30.0  # seconds an attempt waits for its call's downstream entry
NETWORK_METHOD = "envoy grpc access log: upstream wire bytes sent + received, every attempt"
COMPUTE_METHOD = "model server: onnxruntime InferenceSession.run time (x-policyc-compute-us), every attempt"
# why an accounting record has no `gpu_seconds` (compute time is not GPU time)
GPU_MEASURED = "apportioned from NVML's per-process samples of the serving process: see gpu_seconds"
GPU_ABSENT = ("absent: the model servers run onnxruntime's CPU execution provider, so a call holds no GPU "
              "for NVML to measure; the decision record holds the contract's GPU-seconds estimate")


def _seconds(d: object) -> float | None:
    """A protobuf Duration (unset or zero: None). Its two fields read, not `ByteSize()`
    (zero exactly when both are): ~0.25 µs less, five times per call."""
    if d is None:
        return None
    s, n = d.seconds, d.nanos  # type: ignore[attr-defined]
    return float(s) + n / 1e9 if s or n else None


def _address(a: object) -> str:
    sa = a.socket_address  # type: ignore[attr-defined]
    return f"{sa.address}:{sa.port_value}" if sa.address else ""


class Attempt(msgspec.Struct, frozen=True, gc=False):
    """One upstream attempt as Envoy measured it. A msgspec struct rather than a frozen
    dataclass: built once or twice per call on the serving loop (0.24 µs against 1.5, measured),
    and the record's detail encodes it as it stands (the same sorted keys)."""

    host: str
    instance: str | None
    sent: int  # bytes to the model server
    received: int  # bytes from it
    duration: float | None  # seconds
    first_byte: float | None  # seconds from the call's start to the model server's first byte
    status: int  # HTTP status (0: none, e.g. reset)
    grpc_status: str | None
    compute_seconds: float | None  # the model server's own measure
    flags: str  # Envoy's response flags (e.g. upstream reset) as set fields


class Call(msgspec.Struct, gc=False):
    """A downstream call as Envoy measured it. Built once per call on the serving loop and
    never changed after (a msgspec struct: its 24 fields set in 0.5 µs where a slots
    dataclass's `__init__` took 1.05, measured; plain values only, so not tracked by the
    collector)."""

    decision_id: str
    start: float  # Unix seconds
    received: int  # bytes from the client
    sent: int  # bytes to the client
    duration: float | None
    first_byte: float | None
    attempts: int  # how many upstream attempts Envoy says it made
    grpc_status: str | None
    tls: bool
    tls_handshake: float | None = None  # seconds Envoy's TLS handshake with the client took (None: not TLS)
    upstream_first_byte: float | None = None  # seconds from the call's start to the model server's first byte
    upstream_connect: float | None = None  # seconds the TCP connect of the last attempt's upstream connection took
    upstream_connection: str | None = None  # Envoy's id of that connection (its connect is counted once)
    variant: str | None = None  # the answer's model variant (`x-policyc-variant`: full, simplified)
    upstream_host: str = ""  # the host of the last attempt (the one that answered, if any)
    instance: str | None = None  # the instance the answer names (`x-policyc-instance`)
    # the last attempt as the call's entry has it (what `answer_of` builds it from, when the router
    # logs broken attempts only)
    upstream_sent: int = 0  # upstream wire bytes of the last attempt (not summed over retries)
    upstream_received: int = 0
    upstream_duration: float | None = None  # its first byte sent to its last byte read
    upstream_rx_after_tx: float | None = None  # its first byte sent to the model server's first byte
    status: int = 0  # HTTP status of the answer (0: none)
    compute_seconds: float | None = None  # the answer's `x-policyc-compute-us`
    flags: str = ""  # the call's response flags
    trace_id: str | None = None  # a traced call's W3C trace id (its `traceparent`, logged with --otlp-endpoint)


def _flags(common: al.AccessLogCommon) -> str:
    return ",".join(f.name for f, v in common.response_flags.ListFields() if v is True)


def _header(headers: object, name: str) -> str | None:
    v = headers.get(name)  # type: ignore[attr-defined]
    return str(v) if v else None


def _grpc_status(resp: al.HTTPResponseProperties) -> str | None:
    return _header(resp.response_trailers, GRPC_STATUS) or _header(resp.response_headers, GRPC_STATUS)


def attempt_of(entry: al.HTTPAccessLogEntry) -> tuple[str | None, Attempt]:
    """An upstream-log entry: (decision id, the attempt)."""
    c, req, resp = entry.common_properties, entry.request, entry.response
    sent = c.upstream_wire_bytes_sent or (req.upstream_header_bytes_sent + req.request_body_bytes)
    received = c.upstream_wire_bytes_received or (resp.upstream_header_bytes_received + resp.response_body_bytes)
    compute = _compute(resp)
    return _header(req.request_headers, DECISION_HEADER), Attempt(
        host=_address(c.upstream_remote_address), instance=_header(resp.response_headers, INSTANCE_HEADER),
        sent=int(sent), received=int(received), duration=_seconds(c.duration) if c.HasField("duration") else None,
        first_byte=_seconds(c.time_to_first_upstream_rx_byte) if c.HasField("time_to_first_upstream_rx_byte") else None,
        status=int(resp.response_code.value), grpc_status=_grpc_status(resp), compute_seconds=compute, flags=_flags(c))


def _compute(resp: al.HTTPResponseProperties) -> float | None:
    us = _header(resp.response_headers, COMPUTE_HEADER)
    try:
        return int(us) / 1e6 if us is not None else None
    except ValueError:
        return None


def call_of(entry: al.HTTPAccessLogEntry) -> Call | None:
    """A downstream entry (None: the request carried no decision id, so nothing was picked).
    One per call on the serving loop, so each protobuf field is read once, into locals."""
    req = entry.request
    rq = req.request_headers
    did = rq.get(DECISION_HEADER)
    if not did:
        return None
    c, resp = entry.common_properties, entry.response
    rh = resp.response_headers
    has = c.HasField
    start = c.start_time
    tx = _seconds(c.time_to_first_upstream_tx_byte) if has("time_to_first_upstream_tx_byte") else None
    first_rx = _seconds(c.time_to_first_upstream_rx_byte) if has("time_to_first_upstream_rx_byte") else None
    last_rx = _seconds(c.time_to_last_upstream_rx_byte) if has("time_to_last_upstream_rx_byte") else None
    compute = rh.get(COMPUTE_HEADER)
    try:
        compute_s = int(compute) / 1e6 if compute else None
    except ValueError:
        compute_s = None
    return Call(decision_id=str(did), start=start.seconds + start.nanos / 1e9,
                received=int(c.downstream_wire_bytes_received or (req.request_headers_bytes + req.request_body_bytes)),
                sent=int(c.downstream_wire_bytes_sent or (resp.response_headers_bytes + resp.response_body_bytes)),
                duration=_seconds(c.duration) if has("duration") else None,
                first_byte=_seconds(c.time_to_first_downstream_tx_byte) if has("time_to_first_downstream_tx_byte") else None,
                attempts=int(c.upstream_request_attempt_count),
                grpc_status=resp.response_trailers.get(GRPC_STATUS) or rh.get(GRPC_STATUS) or None,
                tls=has("tls_properties") and bool(c.tls_properties.tls_version),
                tls_handshake=_us(rq.get(TLS_HANDSHAKE_HEADER)),
                upstream_first_byte=first_rx,
                upstream_connect=_us(rh.get(UPSTREAM_CONNECT_HEADER)),
                upstream_connection=rh.get(UPSTREAM_CONNECTION_HEADER) or None,
                variant=rh.get(VARIANT_HEADER) or None, upstream_host=_address(c.upstream_remote_address),
                instance=rh.get(INSTANCE_HEADER) or None,
                upstream_sent=int(c.upstream_wire_bytes_sent), upstream_received=int(c.upstream_wire_bytes_received),
                upstream_duration=last_rx - tx if tx is not None and last_rx is not None else None,
                upstream_rx_after_tx=first_rx - tx if tx is not None and first_rx is not None else None,
                status=int(resp.response_code.value), compute_seconds=compute_s,
                flags=_flags(c) if has("response_flags") else "", trace_id=_trace_id(rq.get(TRACEPARENT)))


def _trace_id(traceparent: str | None) -> str | None:
    """The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`); None when absent,
    malformed or all zeros (invalid by the W3C rules)."""
    if not traceparent or len(traceparent) < 55:
        return None
    tid = traceparent[3:35]
    if traceparent[2] != "-" or traceparent[35] != "-" or tid == "0" * 32 or not all(ch in "0123456789abcdef" for ch in tid):
        return None
    return tid


def answer_of(call: Call) -> Attempt:
    """The call's last attempt as its own entry has it (when the router logs broken attempts
    only, the answering one is not in that log). Its times run from its first byte sent
    upstream (a logged attempt's from its start, a fraction of a millisecond earlier)."""
    return Attempt(host=call.upstream_host, instance=call.instance, sent=call.upstream_sent,
                   received=call.upstream_received, duration=call.upstream_duration,
                   first_byte=call.upstream_rx_after_tx, status=call.status, grpc_status=call.grpc_status,
                   compute_seconds=call.compute_seconds, flags=call.flags)


def _last_attempt_broken(call: Call) -> bool:
    """Whether the call's own flags say its last attempt broke (so the router logged it too)."""
    return bool(call.flags) and any(f in call.flags for f in _BROKEN_FLAG_NAMES)


def _us(text: str | None) -> float | None:
    try:
        return float(text) / 1e6 if text else None
    except ValueError:
        return None


# the record's detail: compact JSON, keys sorted (the attempts' fields too), non-ASCII as UTF-8
# (msgspec: a tenth of json.dumps's time, measured)
_DETAIL = msgspec.json.Encoder(order="sorted").encode
# the ResponseFlags fields of `bootstrap.BROKEN_ATTEMPT_FLAGS` (UT, UR, UC): the attempts the router logs
_BROKEN_FLAG_NAMES = ("upstream_request_timeout", "upstream_remote_reset", "upstream_connection_termination")


class _Downstream(msgspec.Struct, gc=False):
    """The detail's `downstream` part (the client's side of the call), written with sorted keys."""

    duration_s: float | None
    first_byte_s: float | None
    grpc_status: str | None
    received: int
    sent: int
    tls: bool
    tls_handshake_s: float | None
    upstream_connect_s: float | None
    upstream_connection: str | None


class _Detail(msgspec.Struct, gc=False):
    """The record's `detail` (its JSON text): structs rather than dicts, one per call on the
    serving loop, written in ~0.6 of the dicts' time (same bytes, measured)."""

    attempts: list[Attempt]
    attempts_expected: int
    attempts_missing: int
    downstream: _Downstream
    gpu_seconds: str


def _routed(call: Call, answer: bool) -> int:
    """How many attempts of `call` the router's log carries (`answer`: the call's own entry
    stands for its last one)."""
    return call.attempts - 1 if answer else call.attempts


def _figures(call: Call, attempts: list[Attempt], gpu_note: str = GPU_ABSENT) -> dict[str, Any]:
    """The record's parts, as both `accounting_record` and `accounting_body` take them."""
    detail = _Detail(attempts, call.attempts, max(call.attempts - len(attempts), 0),
                     _Downstream(call.duration, call.first_byte, call.grpc_status, call.received, call.sent, call.tls,
                                 call.tls_handshake, call.upstream_connect, call.upstream_connection), gpu_note)
    if len(attempts) == 1:  # the common call: its one attempt's figures as they are (the same values)
        a = attempts[0]
        sent, compute, target = a.sent + a.received, a.compute_seconds, a.host or "(no upstream)"
    else:
        computes = [a.compute_seconds for a in attempts if a.compute_seconds is not None]
        sent = 0
        for a in attempts:
            sent += a.sent + a.received
        compute = sum(computes) if computes else None
        target = ",".join(dict.fromkeys(a.host for a in attempts if a.host)) or "(no upstream)"
    return {"network_bytes": float(sent), "network_method": NETWORK_METHOD,
            "compute_seconds": compute, "compute_method": COMPUTE_METHOD, "target": target,
            "detail": _DETAIL(detail).decode(), "trace_id": call.trace_id}


def _with_cpu(figures: dict[str, Any], cpu: tuple[float, str] | None) -> dict[str, Any]:
    """`figures` with the compute time the kernel measured for the serving process's cgroup,
    apportioned to the call (`audit/cgroup_cpu.py`), in place of the model server's own
    (which stays in the detail, per attempt)."""
    if cpu is not None:
        figures.update(compute_seconds=cpu[0], compute_method=cpu[1], compute_kind=Source.APPORTIONED)
    return figures


def accounting_record(call: Call, attempts: list[Attempt], cpu: tuple[float, str] | None = None,
                      gpu: Figure | None = None) -> ActionRecord:
    """The call's one audit record: measured bytes (every attempt, both ways), the model
    server's compute time as `compute_seconds`, or with `cpu` the CPU-seconds of its process's
    cgroup apportioned to it; `gpu`: its process's GPU-seconds from NVML apportioned to it
    (without: absent, see GPU_ABSENT)."""
    figures = _figures(call, attempts, GPU_MEASURED if gpu is not None else GPU_ABSENT)
    return call_accounting(call.decision_id, call.start, gpu_seconds=gpu, **_with_cpu(figures, cpu))


def accounting_body(call: Call, attempts: list[Attempt], cpu: tuple[float, str] | None = None) -> bytes:
    """`accounting_record(call, attempts)`'s stored body (its `model_dump_json(exclude_none=True)`),
    without the pydantic models: what the receiver hands a `body_sink` (the server bridge), a
    fifth of the record's cost on the serving loop (measured)."""
    return call_accounting_body(call.decision_id, call.start, **_with_cpu(_figures(call, attempts), cpu))


@dataclass
class Counts:
    """What the receiver saw (the benchmark reads `dropped` and `recorded`)."""

    entries: int = 0
    calls: int = 0
    recorded: int = 0
    incomplete: int = 0  # recorded after GRACE with attempts missing
    unpicked: int = 0  # downstream entries without a decision id (refused before any pick)
    orphaned: int = 0  # attempts whose call never arrived
    dropped: int = 0  # records the sink refused


@dataclass
class _Pending:
    call: Call | None = None
    attempts: list[Attempt] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


class AccessLogReceiver(als_pb2_grpc.AccessLogServiceServicer):
    """Joins Envoy's two logs by decision id and hands each finished call's record to
    `sink` (e.g. the log's `submit_action`), or its stored body to `body_sink` (the server
    bridge's `accounting_body`: no pydantic models on the serving loop); neither: no
    accounting records, the listeners alone, e.g. the picker learning breaks. Runs on an
    asyncio loop (the decision server's); `serve(server)` adds it to a grpc.aio server."""

    def __init__(self, sink: Callable[[ActionRecord], object] | None, grace: float = GRACE,
                 every_attempt: bool = True, body_sink: Callable[[bytes], object] | None = None) -> None:
        if sink is not None and body_sink is not None:
            raise ValueError("the access-log receiver takes a record sink or a body sink, not both")
        self.sink = sink
        self.body_sink = body_sink
        self.grace = grace
        # False: Envoy's router logs only the broken attempts (`GatewaySpec.log_every_attempt` off),
        # so a call waits for one attempt fewer than it made and its last attempt is read from the
        # call's own entry (`answer_of`), unless the call's flags say that one broke too
        self.every_attempt = every_attempt
        self.counts = Counts()
        self._pending: dict[str, _Pending] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.listeners: list[Callable[[Call, list[Attempt]], None]] = []  # e.g. the cross-layer signal windows
        self.sent_by_host: dict[str, int] = {}  # upstream wire bytes Envoy sent each model server (the kernel cross-check)
        # the kernel's CPU count of each serving process (its cgroup), apportioned to calls
        # (`audit/cgroup_cpu.py`); records wait in `_held` until its samples cover their span
        self.cpu: CgroupCpuMeter | None = None
        self._held: list[tuple[str, Call, list[Attempt], float]] = []

    async def StreamAccessLogs(self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],  # noqa: N802 - gRPC's name
                               context: grpc.aio.ServicerContext) -> als_pb2.StreamAccessLogsResponse:
        name = ""
        async for msg in request_iterator:
            if msg.HasField("identifier"):
                name = msg.identifier.log_name
            for entry in msg.http_logs.log_entry:
                self.counts.entries += 1
                try:
                    self._take(name, entry)
                except Exception:  # noqa: BLE001 - one bad entry must not end Envoy's stream
                    log.exception("access log: entry of %s not understood", name or "(unnamed log)")
        return als_pb2.StreamAccessLogsResponse()

    def _take(self, name: str, entry: al.HTTPAccessLogEntry) -> None:
        if name == UPSTREAM_LOG:
            did, attempt = attempt_of(entry)
            if did is None:
                return
            if attempt.host:
                self.sent_by_host[attempt.host] = self.sent_by_host.get(attempt.host, 0) + attempt.sent
            p = self._pending.setdefault(did, _Pending())
            p.attempts.append(attempt)
            self._settle(did, p, False)
            return
        call = call_of(entry)
        if call is None:
            self.counts.unpicked += 1
            return
        self.counts.calls += 1
        did = call.decision_id
        waiting = self._pending.get(did)
        if waiting is None:
            answer = self._answers(call)
            if _routed(call, answer) > 0:  # attempts still to come from the router's log: wait for them
                self._pending[did] = _Pending(call)
            else:  # the common case: no attempt logged apart, so nothing to wait for and no entry kept
                self._record(did, call, [], answer)
            return
        waiting.call, waiting.since = call, time.monotonic()
        self._settle(did, waiting, False)

    def _answers(self, call: Call) -> bool:
        """Whether the call's own entry stands for its last attempt (the router logs broken ones only)."""
        return not self.every_attempt and call.attempts > 0 and bool(call.upstream_host) and not _last_attempt_broken(call)

    def _want(self, call: Call) -> int:
        """How many attempts of the call the router's log carries."""
        return _routed(call, self._answers(call))

    def _settle(self, did: str, p: _Pending, late: bool) -> None:
        if p.call is None:
            return
        if len(p.attempts) < self._want(p.call) and not late:
            return
        del self._pending[did]
        self._record(did, p.call, p.attempts)

    def _record(self, did: str, call: Call, attempts: list[Attempt], answer: bool | None = None) -> None:
        """The call's accounting record (it is out of `_pending`, or was never in it) with the
        attempts that arrived (the answering one appended here when the call's entry has it;
        `answer`: `_answers(call)` when the caller has it already)."""
        if answer is None:
            answer = self._answers(call)
        if len(attempts) < _routed(call, answer):
            self.counts.incomplete += 1
        if answer:
            a = answer_of(call)
            self.sent_by_host[a.host] = self.sent_by_host.get(a.host, 0) + a.sent
            attempts.append(a)
        for fn in self.listeners:
            fn(call, attempts)
        sink, body_sink = self.sink, self.body_sink
        if sink is None and body_sink is None:
            return
        cpu = self.cpu
        if cpu is not None and len(attempts) == 1 and attempts[0].host and call.duration is not None:
            if cpu.note(attempts[0].host, call.start, call.start + call.duration, did):
                self._held.append((did, call, attempts, time.monotonic()))
                return
        self._emit(did, call, attempts, None)

    def _release_held(self, late: bool) -> None:
        """Record the held calls `CPU_HOLD` seconds after they arrived, once their process's
        samples cover their span (all of them when `late`; after `grace` even uncovered: a
        call whose samples never came keeps the server's figure). The hold lets the calls
        that overlapped one and ended soon after it arrive first, so they share its CPU."""
        cpu, now, keep = self.cpu, time.monotonic(), []
        assert cpu is not None
        for did, call, attempts, since in self._held:
            host, end = attempts[0].host, call.start + (call.duration or 0.0)
            waited = now - since
            if not late and (waited < CPU_HOLD or (not cpu.covered(host, end) and waited < self.grace)):
                keep.append((did, call, attempts, since))
                continue
            share = cpu.apportion(host, call.start, end, did)
            gpu = cpu.apportion_gpu(host, call.start, end, did)
            self._emit(did, call, attempts, (share, cpu.method) if share is not None else None,
                       Figure(value=gpu, source=Source.APPORTIONED, method=cpu.gpu_method or "nvml")
                       if gpu is not None else None)
        self._held = keep

    def _emit(self, did: str, call: Call, attempts: list[Attempt], cpu: tuple[float, str] | None,
              gpu: Figure | None = None) -> None:
        sink, body_sink = self.sink, self.body_sink
        try:
            if body_sink is not None:
                body_sink(accounting_body(call, attempts, cpu) if gpu is None else  # the fast path has no GPU figure
                          accounting_record(call, attempts, cpu, gpu).model_dump_json(exclude_none=True).encode())
            elif sink is not None:
                sink(accounting_record(call, attempts, cpu, gpu))
            self.counts.recorded += 1
        except Exception as e:  # noqa: BLE001 - counted and said, the receiver keeps going
            self.counts.dropped += 1
            log.error("access log: the accounting record of %s was refused: %s", did, e)

    def sweep(self) -> None:
        """Record calls whose missing attempts did not come within `grace`; forget
        attempts whose call never came."""
        now = time.monotonic()
        if self._held:
            self._release_held(False)
        for did, p in list(self._pending.items()):
            if p.call is not None and now - p.since >= self.grace:
                self._settle(did, p, True)
            elif p.call is None and now - p.since >= ORPHAN_AFTER:
                del self._pending[did]
                self.counts.orphaned += len(p.attempts)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.grace / 4)
            self.sweep()

    def pending(self) -> int:
        return len(self._pending) + len(self._held)

    @property
    def records(self) -> bool:
        """Whether this receiver makes an accounting record of every call (so Envoy must log every call)."""
        return self.sink is not None or self.body_sink is not None


class AccessLogServer:
    """The receiver on its own port, on the running loop: `await start()` → `ip:port`."""

    def __init__(self, receiver: AccessLogReceiver, host: str = "127.0.0.1", port: int = 0) -> None:
        self.receiver = receiver
        self.host, self.port = host, port
        self._server: grpc.aio.Server | None = None

    async def start(self) -> str:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(self.receiver, server)
        port = server.add_insecure_port(f"{self.host}:{self.port}")
        if port == 0:
            raise RuntimeError(f"the access-log receiver cannot listen on {self.host}:{self.port} (in use?)")
        await server.start()
        self._server, self.port = server, port
        self.receiver._sweeper = asyncio.get_running_loop().create_task(self.receiver._sweep_forever(),
                                                                         name="policyc-access-log-sweep")
        return f"{self.host}:{port}"

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)  # Envoy's last flush arrives before this returns
            self._server = None
        task = self.receiver._sweeper
        if task is not None:
            task.cancel()
            self.receiver._sweeper = None
        self.receiver.sweep()
        for did, p in list(self.receiver._pending.items()):  # at stop: record what arrived
            if p.call is not None:
                self.receiver._settle(did, p, True)
        if self.receiver._held:
            self.receiver._release_held(True)
        if self.receiver.cpu is not None:
            self.receiver.cpu.stop()
