"""The picker's traces (opt-in, `policyc gateway --otlp-endpoint HOST:PORT`): each pick's
stages as OpenTelemetry spans, children of the span Envoy made for its ext_proc call, sent
over OTLP/gRPC to the same collector Envoy's own tracer sends to.

Why after the fact: the pick is the gateway's hot path (one coroutine, microseconds), so
it only takes `time.perf_counter()` stamps; the spans are built from those stamps and the
decision's own measured stage times (`Decision.timing`) once the answer is written to
Envoy, and exported by the SDK's `BatchSpanProcessor` on its own thread. A pick with no
trace context (no `traceparent` from Envoy) makes no spans.

Parentage: Envoy's ext_proc client injects its span's W3C `traceparent` into the gRPC
call's metadata, which is the parent here; failing that, the `traceparent` among the
request's headers (the client's span, Envoy's parent). The spans: `policyc.pick` (the
whole pick), with children `parse` (the picker's header view and shape key), `match`
(feasibility and the matcher), `place` (the placer) and `audit` (the decision's record
handed to the audit log, and awaited when the log is synchronous). `policyc.decision_id`
is on each span, so a trace leads to the audit record (`policyc audit explain ID`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SERVICE_NAME = "policyc-picker"
DECISION_ATTRIBUTE = "policyc.decision_id"


def check_endpoint(endpoint: str) -> str:
    """`HOST:PORT` of an OTLP/gRPC collector (loopback or not; Envoy resolves only IPs), or
    ValueError naming the problem."""
    from policyc.matcher.instance import canonical_endpoint

    try:
        return canonical_endpoint(endpoint)
    except ValueError as e:
        raise ValueError(f"--otlp-endpoint {endpoint}: {e}") from None


def available() -> str | None:
    """None when the OpenTelemetry SDK and its OTLP/gRPC exporter are installed, else what to install."""
    try:
        import opentelemetry.exporter.otlp.proto.grpc.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return "tracing needs the OpenTelemetry SDK: pip install 'policyc[otel]'"
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


class PickerTracer:
    """The SDK's tracer provider for the picker, exporting in batches over OTLP/gRPC."""

    def __init__(self, endpoint: str, exporter: Any = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # type: ignore[attr-defined]  # mypy does not see the class through the package's typing

            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
        self.endpoint = endpoint
        self.provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        # short delay: a trace is complete at the collector within half a second of its request
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        self.tracer = self.provider.get_tracer("policyc.gateway.picker")
        self._propagator = TraceContextTextMapPropagator()
        # perf_counter -> wall-clock nanoseconds (the spans' clock)
        self._offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)
        self.spans = 0  # picks traced

    def _ns(self, t: float) -> int:
        return self._offset_ns + int(t * 1e9)

    def record(self, stamps: Stamps) -> None:
        """The pick's spans from its stamps and the decision's stage times (none for a
        refusal before any decision). No parent: nothing."""
        decision_id, timing = stamps.decision_id, stamps.timing
        if not stamps.traceparent:
            return
        carrier = {TRACEPARENT: stamps.traceparent}
        if stamps.tracestate:
            carrier[TRACESTATE] = stamps.tracestate
        parent = self._propagator.extract(carrier)
        from opentelemetry import trace

        if not trace.get_current_span(parent).get_span_context().is_valid:
            return  # a malformed traceparent: no trace to join
        attrs = {DECISION_ATTRIBUTE: decision_id} if decision_id else {}
        tracer = self.tracer
        pick = tracer.start_span("policyc.pick", context=parent, kind=trace.SpanKind.SERVER,
                                 start_time=self._ns(stamps.start), attributes=attrs)
        inner = trace.set_span_in_context(pick)
        stages = [("parse", stamps.start, stamps.parsed)]
        if timing is not None:
            match_end = stamps.parsed + timing.feasibility + timing.match
            place_end = min(match_end + timing.place, stamps.decided)
            stages += [("match", stamps.parsed, min(match_end, stamps.decided)), ("place", min(match_end, stamps.decided), place_end),
                       ("audit", place_end, stamps.decided)]
        for name, a, b in stages:
            s = tracer.start_span(name, context=inner, start_time=self._ns(a), attributes=attrs)
            s.end(end_time=self._ns(max(a, b)))
        pick.end(end_time=self._ns(stamps.end))
        self.spans += 1

    def shutdown(self) -> None:
        """Export what is buffered, stop the exporter's thread."""
        self.provider.shutdown()
