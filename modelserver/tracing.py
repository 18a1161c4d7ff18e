"""A model server's trace spans (opt-in): a span around each gRPC inference, continuing the
W3C `traceparent` its caller sent (a policyc gateway's Envoy puts its router span's context
there), exported over OTLP/gRPC with the OpenTelemetry SDK's `BatchSpanProcessor`.

Why the OpenTelemetry environment variables: a model server is started by whoever runs the
fleet (`policyc modelserver`, KServe's deployment, the launcher), and those variables are
how every OpenTelemetry-instrumented process is pointed at its collector. Set
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or `OTEL_EXPORTER_OTLP_ENDPOINT`), e.g.
`http://127.0.0.1:4317`; unset, or without the SDK (`policyc[otel]`), nothing is traced and
inference is unchanged. A request without a `traceparent` makes no span (the server never
starts traces of its own: its caller decides what is traced).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping

log = logging.getLogger("policyc.modelserver")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE_NAME = "policyc-modelserver"
SPAN_NAME = "modelserver.infer"


class ServerTracer:
    """The process's tracer provider (made in the serving process, after any fork: the batch
    processor's thread does not survive one)."""

    def __init__(self, endpoint: str) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # type: ignore[attr-defined]  # mypy does not see the class through the package's typing
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        insecure = not endpoint.startswith("https://")
        self.provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure),
                                                            schedule_delay_millis=200))
        self.tracer = self.provider.get_tracer("policyc.modelserver")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, headers: Mapping[str, Any], model: str) -> Any | None:
        """A span for one inference, child of the caller's; None when the call carries no
        (valid) trace context. End it with `span.end()`."""
        parent_header = headers.get("traceparent")
        if not parent_header:
            return None
        from opentelemetry import trace

        carrier = {"traceparent": str(parent_header)}
        if (state := headers.get("tracestate")) is not None:
            carrier["tracestate"] = str(state)
        parent = self._propagator.extract(carrier)
        if not trace.get_current_span(parent).get_span_context().is_valid:
            return None
        attrs = {"policyc.model": model}
        if (did := headers.get("x-policyc-decision-id")) is not None:
            attrs["policyc.decision_id"] = str(did)
        return self.tracer.start_span(SPAN_NAME, context=parent, kind=trace.SpanKind.SERVER, attributes=attrs,
                                      start_time=time.time_ns())

    def shutdown(self) -> None:
        self.provider.shutdown()


def from_environment() -> ServerTracer | None:
    """The tracer the OpenTelemetry environment asks for, or None (unset; the SDK missing is
    logged once, never fatal: inference goes on untraced)."""
    endpoint = next((v for k in ENDPOINT_VARIABLES if (v := os.environ.get(k))), None)
    if endpoint is None:
        return None
    try:
        return ServerTracer(endpoint)
    except ImportError:
        log.warning("%s is set but the OpenTelemetry SDK is not installed (pip install 'policyc[otel]'): not tracing",
                    next(k for k in ENDPOINT_VARIABLES if os.environ.get(k)))
        return None
