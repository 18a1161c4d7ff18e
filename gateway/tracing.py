"""The picker's traces (opt-in, `policyc gateway --otlp-endpoint HOST:PORT`): each pick's
stages as OpenTelemetry spans, children of the span Envoy made for its ext_proc call, sent
over OTLP/gRPC to the same collector Envoy's own tracer sends to.

Why built by hand: the pick is the gateway's hot path (one coroutine, microseconds) and the
OpenTelemetry SDK's span objects, processors and exporter cost ~150 µs a pick to build and
as much again to encode and send (benchmarks/RESULTS.md, issue 40), on threads sharing the
GIL with the serving loop. So the pick only takes `time.perf_counter()` stamps; once its
answer is written, `record` checks the W3C sampled flag and queues the stamps (a list
append); a thread of this tracer wakes every `FLUSH_S`, writes the queued picks' spans as
OTLP protobuf bytes directly (`otlp_bytes.py`, the wire format of
`opentelemetry/proto/trace/v1/trace.proto`) and sends them in one `Export` call. Sampling
is the parent's (parent-based, as the SDK's default sampler): a pick whose `traceparent`
is absent, malformed or not sampled costs a check and nothing else.

Parentage: Envoy's ext_proc client injects its span's W3C `traceparent` into the gRPC
call's metadata, which is the parent here; failing that, the `traceparent` among the
request's headers (the client's span, Envoy's parent). The spans: `policyc.pick` (the
whole pick), with children `parse` (the picker's header view and shape key), `match`
(feasibility and the matcher), `place` (the placer) and `audit` (the decision's record
handed to the audit log, and awaited when the log is synchronous). `policyc.decision_id`
is on each span, so a trace leads to the audit record (`policyc audit explain ID`).

Bounded: at most `MAX_QUEUED` picks wait for the exporter; beyond that a pick's spans are
dropped and counted (`dropped`), never the request slowed. A failed `Export` (counted in
`failed`, logged once) costs one call per flush: its batch is tried again on the next flushes,
`TRIES` calls in all (as OpenTelemetry's exporters retry a retryable failure), then dropped and
counted, while what is queued behind it waits within the same bound. So a collector slow to
take its first call (a channel still connecting on a loaded machine) loses no span, one that is
away costs at most `MAX_QUEUED` picks' memory, and a flush waits for one call's timeout at most;
the gateway's stop (`shutdown`) waits for the flush under way, tries once more and drops what is
left.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from . import otlp_bytes

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SERVICE_NAME = "policyc-picker"
SCOPE_NAME = "policyc.gateway.picker"
DECISION_ATTRIBUTE = "policyc.decision_id"
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
FLUSH_S = 0.2  # a trace is complete at the collector within about this long after its request
MAX_QUEUED = 50_000  # picks waiting for the exporter (about 50 s at 1,000 picks/s with the collector away)
MAX_BATCH = 2_000  # picks per Export call (about 1 MB of spans; gRPC's default limit is 4 MB)
EXPORT_TIMEOUT_S = 5.0
TRIES = 3  # Export calls for one batch, one a flush, before its picks are dropped

log = logging.getLogger(__name__)


def check_endpoint(endpoint: str) -> str:
    """`HOST:PORT` of an OTLP/gRPC collector (loopback or not; Envoy resolves only IPs), or
    ValueError naming the problem."""
    from policyc.matcher.instance import canonical_endpoint

    try:
        return canonical_endpoint(endpoint)
    except ValueError as e:
        raise ValueError(f"--otlp-endpoint {endpoint}: {e}") from None


def available() -> str | None:
    """None when grpc is installed (the spans are written by hand and sent over plain gRPC),
    else what to install."""
    try:
        import grpc  # noqa: F401
    except ImportError:
        return "tracing needs grpcio: pip install 'policyc[otel]'"
    return None


@dataclass(slots=True)
class Stamps:
    """What the pick measured for its spans (`time.perf_counter()` seconds)."""

    start: float = 0.0
    parsed: float = 0.0
    decided: float = 0.0  # after the decision and its audit record (awaited when the log is synchronous)
    end: float = 0.0
    traceparent: str = ""
    tracestate: str = ""
    decision_id: str = ""  # the decision's, admitted or refused ("" when refused before deciding)
    timing: Any = None  # the decision's `Timing` (its measured stage times)


def trace_context(metadata: Iterable[tuple[str, Any]] | None, headers: Sequence[Any] = ()) -> tuple[str, str]:
    """(traceparent, tracestate): from the ext_proc call's gRPC metadata (Envoy's span), else
    from the request's headers (the client's); ("", "") when neither carries one."""
    parent = state = ""
    for k, v in metadata or ():
        if k == TRACEPARENT:
            parent = v if isinstance(v, str) else v.decode("ascii", "replace")
        elif k == TRACESTATE:
            state = v if isinstance(v, str) else v.decode("ascii", "replace")
    if parent:
        return parent, state
    for h in headers:
        if h.key == TRACEPARENT:
            parent = h.raw_value.decode("ascii", "replace") if h.raw_value else h.value
        elif h.key == TRACESTATE:
            state = h.raw_value.decode("ascii", "replace") if h.raw_value else h.value
    return parent, state


_SAMPLED_FLAGS = frozenset(f"{i:02x}" for i in range(256) if i & 1) | frozenset(f"{i:02X}" for i in range(256) if i & 1)


def sampled(traceparent: str) -> bool:
    """Whether a W3C traceparent asks for its trace to be recorded (its flags' sampled bit);
    the full check of its fields is the exporter's (`otlp_bytes.parse_traceparent`)."""
    return len(traceparent) >= 55 and traceparent[53:55] in _SAMPLED_FLAGS


class PickerTracer:
    """Queues sampled picks on the serving loop; a thread of its own writes their spans as
    OTLP bytes and exports them in batches over OTLP/gRPC.

    `send`: where an encoded `ExportTraceServiceRequest` goes (tests); by default a gRPC
    channel to `endpoint`."""

    def __init__(self, endpoint: str, send: Callable[[bytes], None] | None = None) -> None:
        self.endpoint = endpoint
        self._channel: Any = None
        if send is None:
            import grpc

            self._channel = grpc.insecure_channel(endpoint)
            export = self._channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
            send = lambda body: export(body, timeout=EXPORT_TIMEOUT_S)  # noqa: E731
        self._send = send
        self._resource = otlp_bytes.resource({"service.name": SERVICE_NAME})
        self._scope = otlp_bytes.scope(SCOPE_NAME)
        # perf_counter -> wall-clock nanoseconds (the spans' clock)
        self._offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)
        self._queue: deque[Stamps] = deque()  # appended on the loop, drained on the exporter's thread (both atomic)
        self._lock = threading.Lock()
        self._held: tuple[bytes, int] | None = None  # a batch whose Export failed: its request and picks, tried again
        self._tries = 0  # of the held batch
        self._wake = threading.Event()
        self._stop = False
        self._random = random.Random()
        self.spans = 0  # picks traced (queued)
        self.exported = 0  # picks whose spans the collector took
        self.dropped = 0  # picks left out: the queue was full
        self.invalid = 0  # sampled-looking traceparents that did not parse
        self.failed = 0  # Export calls that failed
        self.cpu_s = 0.0  # CPU seconds spent writing and sending spans (the exporter's thread, and `shutdown`'s last flush)
        self._thread = threading.Thread(target=self._run, name="policyc-otlp-export", daemon=True)
        self._thread.start()

    def record(self, stamps: Stamps) -> None:
        """Queue a traced pick's stamps (on the serving loop: a flag check and an append). A
        pick without a sampled parent: nothing."""
        if not sampled(stamps.traceparent):
            return
        queue = self._queue
        if len(queue) >= MAX_QUEUED:
            self.dropped += 1
            return
        queue.append(stamps)
        self.spans += 1

    def _run(self) -> None:
        while True:
            self._wake.wait(FLUSH_S)
            self._wake.clear()
            if self._stop:  # `shutdown` makes the last flush
                return
            self.flush()

    def flush(self, last: bool = False) -> None:
        """Write and send what is queued (the exporter's thread; `shutdown` calls it `last`:
        what fails then is dropped), its CPU time added to `cpu_s` (what tracing costs the
        picker off the serving loop)."""
        t0 = time.thread_time()
        try:
            self._flush(last)
        finally:
            self.cpu_s += time.thread_time() - t0

    def _flush(self, last: bool) -> None:
        with self._lock:  # one flush at a time (the thread's and shutdown's)
            queue = self._queue
            while self._held is not None or queue:
                if self._held is None:
                    pop = queue.popleft
                    self._held, self._tries = self._encode([pop() for _ in range(min(len(queue), MAX_BATCH))]), 0
                    if self._held is None:
                        continue
                body, n = self._held
                if self._sent(body, n):
                    self._held = None
                    continue
                self._tries += 1  # one call's timeout per flush at most: the rest waits for the next
                if self._tries >= TRIES or last:
                    self._held = None
                    self.dropped += n
                if last:
                    self.dropped += len(queue)
                    queue.clear()
                return

    def _encode(self, batch: list[Stamps]) -> tuple[bytes, int] | None:
        """One batch's `ExportTraceServiceRequest` and how many picks it carries (None: none valid)."""
        spans = []
        for stamps in batch:
            encoded = self._spans(stamps)
            if encoded is None:
                self.invalid += 1
            else:
                spans.append(encoded)
        return (otlp_bytes.export_request(self._resource, self._scope, spans), len(spans)) if spans else None

    def _sent(self, body: bytes, n: int) -> bool:
        """Send one request of `n` picks' spans; False when the collector did not take it."""
        try:
            self._send(body)
        except Exception as e:  # noqa: BLE001 - a collector away costs the spans, never a request
            self.failed += 1
            if self.failed == 1:
                log.warning("tracing: the OTLP collector at %s refused %d picks' spans: %s (tried again, %d calls in all)",
                            self.endpoint, n, e, TRIES)
            return False
        self.exported += n
        return True

    def _spans(self, stamps: Stamps) -> bytes | None:
        """The pick's five spans (one for a refusal before any decision) as the concatenated
        `ScopeSpans.spans` fields, or None for a traceparent that does not parse."""
        parent = otlp_bytes.parse_traceparent(stamps.traceparent)
        if parent is None:
            return None
        trace_id, parent_id = parent
        off = self._offset_ns
        attrs = otlp_bytes.string_attribute(DECISION_ATTRIBUTE, stamps.decision_id) if stamps.decision_id else b""
        state = stamps.tracestate if len(stamps.tracestate) <= otlp_bytes.MAX_TRACESTATE else ""
        start, parsed = off + int(stamps.start * 1e9), off + int(stamps.parsed * 1e9)
        stages = [("parse", start, max(start, parsed))]
        timing = stamps.timing
        if timing is not None:
            decided = stamps.decided
            match_end = min(stamps.parsed + timing.feasibility + timing.match, decided)
            place_end = min(match_end + timing.place, decided)
            m, p, d = off + int(match_end * 1e9), off + int(place_end * 1e9), off + int(decided * 1e9)
            stages += [("match", parsed, max(parsed, m)), ("place", m, max(m, p)), ("audit", p, max(p, d))]
        return otlp_bytes.pick_spans(trace_id, parent_id, self._random.randbytes(8 * (1 + len(stages))),
                                     ("policyc.pick", start, off + int(stamps.end * 1e9)), stages, attrs, state)

    def shutdown(self) -> None:
        """Export what is queued, stop the exporter's thread, close the channel."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=EXPORT_TIMEOUT_S + 5)
        if self._thread.is_alive():  # its export is stuck past its own timeout: do not wait on it again
            log.warning("tracing: the exporter did not finish; %d picks' spans not sent", len(self._queue))
        else:
            self.flush(last=True)
        if self._channel is not None:
            self._channel.close()
