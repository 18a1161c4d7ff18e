"""What one client may hold of a gateway, and the pieces of Envoy's bootstrap that bound it.

Each bound is a flag of `policyc gateway` (`cli/gateway_flags.py`) and a field of `Limits`:

| bound | Envoy's setting | what a client sees beyond it |
| --- | --- | --- |
| a request's headers must arrive within `request_headers_timeout_s` | HCM `request_headers_timeout` | the connection closed (a slow-header trickle) |
| a connection with no stream lives `idle_timeout_s` | `common_http_protocol_options.idle_timeout` | the connection closed (GOAWAY on HTTP/2) |
| a stream with no bytes either way lives `stream_idle_timeout_s` | HCM `stream_idle_timeout` | 408 / the stream reset |
| at most `max_connections` client connections | the overload manager's `global_downstream_max_connections` | the connection closed at once |
| at most `max_concurrent_streams` streams per HTTP/2 connection | `http2_protocol_options.max_concurrent_streams` (SETTINGS) | the client queues; a stream beyond it is refused (REFUSED_STREAM) |
| `connection_buffer_bytes` buffered per connection | listener `per_connection_buffer_limit_bytes` | flow control holds the client back |
| `max_request_headers_kb` of headers, `max_headers_count` headers | the picker's check (`PickerConfig.max_header_bytes`), with the codec's own limits set above them | 431 with `x-policyc-reason`, over HTTP/1.1 and HTTP/2 alike |
| at most `max_pending_picks` requests waiting for the picker | the picker cluster's circuit breaker | 429 (gRPC: RESOURCE_EXHAUSTED) with `x-policyc-reason` at once, long before the ext_proc message timeout could fire |
| Envoy's heap at `max_heap_mb` | the overload manager (`fixed_heap`): shrink the heap at 90 %, stop accepting requests at 98 % | 503 with `x-policyc-reason` |

Why the header limits live in the picker: Envoy's HTTP/1.1 codec answers 431 past its limits,
but its HTTP/2 codec resets the stream (INTERNAL_ERROR) or, for a header block its HPACK
decoder will not take, ends the whole connection (COMPRESSION_ERROR). So the codec's limits
are set `CODEC_HEADROOM` times above the policy's, and the picker refuses at the policy's
limit with a clean 431, the same on both protocols. What the codec still cannot decode (one
header value over 64 KiB, a header block over the codec's limit) ends as before: that bound
is the decoder's, not configurable.

Every local reply Envoy makes itself (an overflow of the picker's queue, a picker that did not
answer, an upstream timeout, the overload manager) carries `x-policyc-reason` too
(`local_reply_mappers`): the picker's own refusals keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REASON_HEADER = "x-policyc-reason"
CAUSE_HEADER = "x-policyc-refusal"
CODEC_HEADROOM = 4  # the codec's header limits over the policy's: the policy's refusal is a clean 431
CODEC_MAX_HEADERS_KB = 8192  # Envoy's own bound on `max_request_headers_kb`
CODEC_MIN_HEADERS_COUNT = 10_000  # many tiny headers are bounded by their bytes: the picker's 431 answers them too
HEAP_MONITOR = "envoy.resource_monitors.fixed_heap"
CONNECTIONS_MONITOR = "envoy.resource_monitors.global_downstream_max_connections"


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds one client meets at the gateway (the table in this module's docstring)."""

    request_headers_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    stream_idle_timeout_s: float = 60.0
    max_connections: int = 4096
    max_concurrent_streams: int = 128
    connection_buffer_bytes: int = 1 << 20
    max_request_headers_kb: int = 60
    max_headers_count: int = 100
    max_pending_picks: int = 32
    max_heap_mb: int = 1024

    def check(self) -> None:
        """ValueError naming the first bound out of its range."""
        for name, lo, hi in (("request_headers_timeout_s", 0.05, 3600.0), ("idle_timeout_s", 0.05, 86400.0),
                             ("stream_idle_timeout_s", 0.05, 86400.0), ("max_connections", 1, 1_000_000),
                             ("max_concurrent_streams", 1, 2_147_483_647), ("connection_buffer_bytes", 16_384, 1 << 30),
                             ("max_request_headers_kb", 1, CODEC_MAX_HEADERS_KB // CODEC_HEADROOM),
                             ("max_headers_count", 1, 10_000), ("max_pending_picks", 1, 1_000_000),
                             ("max_heap_mb", 4, 1 << 20)):
            value = getattr(self, name)
            if not lo <= value <= hi:  # NaN too
                raise ValueError(f"{name.replace('_', '-')} must be within {lo:g} and {hi:g}, got {value}")

    @property
    def max_header_bytes(self) -> int:
        return self.max_request_headers_kb * 1024


def _seconds(s: float) -> str:
    return f"{s:.3f}s"


def connection_manager_options(limits: Limits) -> dict[str, Any]:
    """The HTTP connection manager's fields that bound a client: timeouts, codec limits
    (above the picker's, see the module docstring), HTTP/2 streams per connection."""
    return {
        "request_headers_timeout": _seconds(limits.request_headers_timeout_s),
        "stream_idle_timeout": _seconds(limits.stream_idle_timeout_s),
        "max_request_headers_kb": min(limits.max_request_headers_kb * CODEC_HEADROOM, CODEC_MAX_HEADERS_KB),
        "common_http_protocol_options": {"idle_timeout": _seconds(limits.idle_timeout_s),
                                         "max_headers_count": max(limits.max_headers_count * CODEC_HEADROOM,
                                                                  CODEC_MIN_HEADERS_COUNT)},
        "http2_protocol_options": {"max_concurrent_streams": limits.max_concurrent_streams},
        "local_reply_config": {"mappers": local_reply_mappers(limits)},
    }


def listener_options(limits: Limits) -> dict[str, Any]:
    """The listener's own fields: its per-connection buffer, and no port sharing (a second
    Envoy on the same port is a bind error, never a silent half of the traffic)."""
    return {"per_connection_buffer_limit_bytes": limits.connection_buffer_bytes, "enable_reuse_port": False}


def picker_circuit_breaker(limits: Limits) -> dict[str, Any]:
    """The picker cluster's bound on requests waiting for a pick: beyond it, ext_proc fails
    at once with an overflow, which `local_reply_mappers` answers as 429."""
    return {"thresholds": [{"max_requests": limits.max_pending_picks, "max_pending_requests": limits.max_pending_picks,
                            "max_retries": 0}]}


def _header(key: str, value: str, if_absent: bool = False) -> dict[str, Any]:
    return {"header": {"key": key, "value": value},
            "append_action": "ADD_IF_ABSENT" if if_absent else "OVERWRITE_IF_EXISTS_OR_ADD"}


def _cel(expression: str) -> dict[str, Any]:
    return {"extension_filter": {"name": "envoy.access_loggers.extension_filters.cel", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
        "expression": expression}}}


def local_reply_mappers(limits: Limits) -> list[dict[str, Any]]:
    """Envoy's own refusals, each with its reason (the first mapper that matches applies):
    the picker's queue overflowed → 429; the picker failed or was late → 503 saying so; the
    overload manager → 503 saying so; anything else Envoy answers itself keeps its status
    and gets Envoy's response code details as its reason, unless the picker gave one."""
    shed = (f"shedding: {limits.max_pending_picks} requests are already waiting for the endpoint picker "
            "(policyc gateway --max-pending-picks)")
    overflow = "response.code_details.startsWith('ext_proc_error') && response.code_details.contains('overflow')"
    grpc = "request.headers['content-type'].startsWith('application/grpc')"
    return [
        # a gRPC caller gets RESOURCE_EXHAUSTED, as from the picker's own shedding (HTTP 429 alone reads as UNAVAILABLE)
        {"filter": _cel(f"{overflow} && {grpc}"), "status_code": 429,
         "headers_to_add": [_header(REASON_HEADER, shed), _header(CAUSE_HEADER, "shed"), _header("grpc-status", "8")]},
        {"filter": _cel(overflow), "status_code": 429,
         "headers_to_add": [_header(REASON_HEADER, shed), _header(CAUSE_HEADER, "shed")]},
        {"filter": _cel("response.code_details.startsWith('ext_proc_error')"),
         "headers_to_add": [_header(REASON_HEADER, "the endpoint picker did not answer: %RESPONSE_CODE_DETAILS%"),
                            _header(CAUSE_HEADER, "picker")]},
        {"filter": _cel("response.code_details == 'overload'"),  # the overload manager's refusal
         "headers_to_add": [_header(REASON_HEADER, "the gateway is overloaded (Envoy's overload manager: "
                                                   f"heap near --max-heap-mb {limits.max_heap_mb})"),
                            _header(CAUSE_HEADER, "overload")]},
        {"filter": {"not_health_check_filter": {}},
         "headers_to_add": [_header(REASON_HEADER, "envoy: %RESPONSE_CODE_DETAILS%", if_absent=True),
                            _header(CAUSE_HEADER, "envoy", if_absent=True)]},
    ]


def overload_manager(limits: Limits) -> dict[str, Any]:
    """The overload manager: Envoy's heap bounded (shrink it at 90 %, stop accepting requests
    at 98 %), its downstream connections counted against `max_connections` across listeners."""
    return {
        "refresh_interval": "0.25s",
        "resource_monitors": [
            {"name": HEAP_MONITOR, "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                "max_heap_size_bytes": limits.max_heap_mb << 20}},
            {"name": CONNECTIONS_MONITOR, "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3."
                         "DownstreamConnectionsConfig",
                "max_active_downstream_connections": limits.max_connections}},
        ],
        "actions": [
            {"name": "envoy.overload_actions.shrink_heap", "triggers": [{"name": HEAP_MONITOR, "threshold": {"value": 0.90}}]},
            {"name": "envoy.overload_actions.stop_accepting_requests",
             "triggers": [{"name": HEAP_MONITOR, "threshold": {"value": 0.98}}]},
        ],
    }
