"""The Envoy bootstrap for a policyc gateway: a pure function from `GatewaySpec` to the
config dict Envoy reads (`json.dumps` it; Envoy takes JSON as YAML).

What it wires, and why each piece is Envoy's own:

- a listener (HTTP/1.1 or HTTP/2, gRPC included) whose `ext_proc` filter asks policyc's
  endpoint picker about every request's headers (the Gateway API Inference Extension's
  Endpoint Picker Protocol): policyc answers with the chosen `ip:port` list in the
  `envoy.lb` dynamic metadata (and the `x-gateway-destination-endpoint` header), a per-try
  timeout (`x-envoy-upstream-rq-per-try-timeout-ms`, the breaker's budget), the decision id
  and the per-attempt headers of the redirect; or an immediate 400/403/429/503.
- the pool cluster (HTTP/2 to the model servers' gRPC ports) balanced by Envoy's
  `override_host` load balancer: it takes the picker's list and hands the next host to
  each attempt, so the retry after a per-try timeout goes to the fallback (the backup);
  the served host is written back into `envoy.lb` (`selected_host_key`) for a picker that
  learns breaks in the response phase (an Envoy with no policyc access log). At the per-try timeout Envoy resets that one upstream stream
  (RST_STREAM): the connection and its sibling streams carry on.
- the route's retry policy: one retry, on a reset or a per-try timeout.
- an upstream Lua filter that runs per attempt: Envoy can add `x-envoy-attempt-count`
  per attempt, but no built-in header mutation is conditional on the attempt, so the
  redirect's headers (`X-Retry-Count: 1`) are set here on attempts after the first
  (`RETRY_LUA`).
- the pool's endpoints either inline (`endpoints`, for users who run their own Envoy) or
  from a file Envoy watches (`eds_path`: file-based EDS, rewritten atomically by
  `policyc gateway` whenever the registered pool changes).
- Envoy's gRPC access-log service (`access_log_cluster`, policyc's receiver in
  `gateway/access_log.py`), flushed every `access_log_flush_ms`: per-call accounting and,
  with `breaks_from_access_log`, how the picker learns that Envoy broke a stream and
  retried it (attempt count, the host that answered), so the response phase is off for
  every request and each call costs one ext_proc exchange.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from policyc.matcher.instance import canonical_endpoint

from . import limits as bounds
from .limits import Limits

from .llm_routes import LlmRoutes, llm_clusters, llm_listener_limits, llm_picker_filter, llm_routes

PICKER_CLUSTER = "policyc_picker"
POOL_CLUSTER = "policyc_pool"
OTLP_CLUSTER = "policyc_otlp"  # the OpenTelemetry collector Envoy's tracer exports to (`otlp_endpoint`)
ALS_CLUSTER = "policyc_access_log"  # reserved for the access-log service (issue 20)
# Envoy sends its buffered access-log entries when this many bytes are buffered or at the flush
# interval, whichever comes first. Its default (16 KiB, ~20 of policyc's ~820-byte entries) made
# several messages per interval at a few hundred calls/s, each costing the receiver a gRPC
# message (~90 us on the serving loop, measured) and Envoy a send: this size leaves the interval
# to decide up to ~25,000 calls/s, and one message stays far under gRPC's 4 MiB receive limit.
ALS_BUFFER_BYTES = 1 << 20
LISTENER = "policyc_gateway"
ENDPOINT_KEY = "x-gateway-destination-endpoint"  # Endpoint Picker Protocol
SERVED_KEY = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"  # the Endpoint Picker Protocol's candidate subset (v0.3.0 on)
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
# the picker marks a request that can break (it has a budget) in this dynamic metadata, so an
# access log that carries only what the picker needs logs only those calls
WATCH_NAMESPACE = "policyc.gateway"
WATCH_KEY = "breakable"
# an attempt Envoy broke: its per-try timeout (UT), a reset by the upstream (UR), the connection ended (UC)
BROKEN_ATTEMPT_FLAGS = ("UT", "UR", "UC")
RETRY_HEADERS = "x-policyc-retry-headers"  # picker -> Lua: headers for attempts after the first
DECISION_HEADER = "x-policyc-decision-id"
TRACEPARENT = "traceparent"  # W3C trace context: logged when the gateway traces, so a call's record names its trace
PER_TRY_TIMEOUT = "x-envoy-upstream-rq-per-try-timeout-ms"
MAX_RETRIES = "x-envoy-max-retries"
ATTEMPT_COUNT = "x-envoy-attempt-count"
# what marks an attempt as a retry to a model server (modelserver/wire.py: `x-retry-count`, and Envoy's
# attempt count, which the router sets itself on every attempt): never taken from a client
CLIENT_RETRY_MARKS = ("x-retry-count", ATTEMPT_COUNT)
TLS_HANDSHAKE_HEADER = "x-policyc-tls-handshake-us"  # the request's connection: from its start to the end of its TLS handshake
# on the answer, for the access log: the TCP connect time of the upstream connection that carried the
# call's last attempt (Envoy's US_CX_BEG..US_CX_END; the ALS entry has no field for it) and that
# connection's id, so the receiver counts each connection's connect once
UPSTREAM_CONNECT_HEADER = "x-policyc-upstream-connect-us"
UPSTREAM_CONNECTION_HEADER = "x-policyc-upstream-connection"

# Per attempt (an upstream filter runs once for each try): drop the picker's instructions
# from what the model server sees and, on a retry, set the headers they name (urlencoded).
# A pick with no redirect sends no such header: one lookup and out (this filter runs for
# every request; the early return saves Envoy ~30 us of its ~400 us per request, measured).
RETRY_LUA = """
local function unescape(s)
  s = string.gsub(s, "+", " ")
  return (string.gsub(s, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end
function envoy_on_request(handle)
  local headers = handle:headers()
  local wanted = headers:get("x-policyc-retry-headers")
  if wanted == nil then return end
  headers:remove("x-policyc-retry-headers")
  local attempt = tonumber(headers:get("x-envoy-attempt-count") or "1")  -- (tonumber(nil) is an error)
  if attempt == nil or attempt < 2 then return end
  for pair in string.gmatch(wanted, "[^&]+") do
    local k, v = string.match(pair, "^([^=]+)=(.*)$")
    if k ~= nil then headers:replace(unescape(k), unescape(v)) end
  end
end
"""


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    """What a gateway needs to know; every address is loopback unless said otherwise."""

    picker: str  # `ip:port` of policyc's ext_proc endpoint picker, or `unix:/path` (its Unix socket)
    pickers: tuple[str, ...] = ()  # several replicas' pickers (one ext_proc cluster); empty: `picker` alone
    listen: str = "127.0.0.1:8080"  # where clients connect
    admin: str = "127.0.0.1:9901"  # Envoy's admin interface (ready, stats)
    endpoints: tuple[str, ...] = ()  # the pool inline ...
    eds_path: str | None = None  # ... or from this file (file-based EDS), rewritten as the pool changes
    failure_mode_allow: bool = False  # picker unreachable: False -> 500 to the client; True -> Envoy's round-robin
    picker_timeout_ms: int = 200  # per ext_proc message
    route_timeout_ms: int = 30_000  # the whole request, all attempts
    retries: int = 1  # attempts after the first: the redirect to the backup
    retry_budget: float | None = None  # share of active requests that may be retries (the breakers' `retry_budget`)
    min_retry_concurrency: int = 3
    use_picker: bool = True  # False: a plain round-robin gateway over the same pool (the benchmark's baseline)
    access_log_cluster: str | None = None  # the gRPC access-log service's `ip:port` (policyc's receiver or the user's)
    access_log_flush_ms: int = 50  # how long Envoy buffers entries: bounds how late the picker learns of a break
    breaks_from_access_log: bool = False  # the picker follows that log (policyc's receiver): no response phase at all
    # every call in that log, both logs (per-call accounting); False (with breaks_from_access_log): only the
    # calls the picker marked breakable, the connection manager's log alone (what finding breaks needs)
    log_every_call: bool = True
    # False: the router's log carries only the attempts Envoy broke; the answering attempt is read
    # from the call's own entry (policyc's receiver does: one entry per unbroken call, not two)
    log_every_attempt: bool = True
    tls_cert: str | None = None  # with tls_key: the listener serves TLS (PEM files), its handshake times logged
    tls_key: str | None = None
    node_id: str = "policyc-gateway"
    llm: LlmRoutes | None = None  # the LLM routes (bodies read, HTTP/1.1 upstreams): gateway/llm_routes.py
    extra_response_headers: tuple[tuple[str, str], ...] = field(default=())
    limits: Limits = Limits()  # what one client may hold: timeouts, connections, streams, headers, picks waiting
    # an OTLP/gRPC collector's `ip:port`: Envoy traces every request (W3C traceparent, OpenTelemetry) and
    # sends its spans there; the picker's and the model server's spans continue its trace (gateway/tracing.py)
    otlp_endpoint: str | None = None
    # the percentage of requests without a client's sampling decision that Envoy traces (its random sampling);
    # a client's traceparent decides for its own request, sampled or not (parent-based)
    otlp_sampling: float = 100.0


def _address(endpoint: str) -> dict[str, Any]:
    ep = canonical_endpoint(endpoint)
    host, _, port = ep.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def load_assignment(cluster: str, endpoints: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """A ClusterLoadAssignment for `endpoints` (also what the EDS file holds)."""
    return {"cluster_name": cluster,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(e)}} for e in endpoints]}]}


def eds_document(endpoints: tuple[str, ...] | list[str], version: str) -> dict[str, Any]:
    """The file-based EDS document Envoy watches (a DiscoveryResponse)."""
    cla = {"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
           **load_assignment(POOL_CLUSTER, endpoints)}
    return {"version_info": version, "resources": [cla]}


def _h2(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    opts: dict[str, Any] = {"@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}}}
    if extra:
        opts.update(extra)
    return {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts}


def _lb_policy(name: str, type_url: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"policies": [{"typed_extension_config": {"name": name, "typed_config": {"@type": type_url, **(config or {})}}}]}


def _round_robin() -> dict[str, Any]:
    return _lb_policy("envoy.load_balancing_policies.round_robin",
                      "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin")


def _pool_cluster(spec: GatewaySpec) -> dict[str, Any]:
    upstream_filters = [
        {"name": "policyc.retry_headers",
         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                          "default_source_code": {"inline_string": RETRY_LUA}}},
        {"name": "envoy.filters.http.upstream_codec",
         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"}},
    ]
    cluster: dict[str, Any] = {
        "name": POOL_CLUSTER,
        "connect_timeout": "1s",
        "typed_extension_protocol_options": _h2({"http_filters": upstream_filters} if spec.use_picker else None),
    }
    if spec.use_picker:
        cluster["load_balancing_policy"] = _lb_policy(
            "envoy.load_balancing_policies.override_host",
            "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            {"override_host_sources": [{"metadata": {"key": LB_NAMESPACE, "path": [{"key": ENDPOINT_KEY}]}}],
             "selected_host_key": {"key": LB_NAMESPACE, "path": [{"key": SERVED_KEY}]},
             "fallback_policy": _round_robin()})
    else:
        cluster["load_balancing_policy"] = _round_robin()
    if spec.retry_budget is not None:
        cluster["circuit_breakers"] = {"thresholds": [{"retry_budget": {
            "budget_percent": {"value": round(spec.retry_budget * 100.0, 3)},
            "min_retry_concurrency": spec.min_retry_concurrency}}]}
    if spec.eds_path is not None:
        cluster["type"] = "EDS"
        cluster["eds_cluster_config"] = {"eds_config": {"path_config_source": {"path": spec.eds_path},
                                                        "resource_api_version": "V3"}}
    else:
        cluster["type"] = "STATIC"
        cluster["load_assignment"] = load_assignment(POOL_CLUSTER, spec.endpoints)
    return cluster


def _picker_address(picker: str) -> dict[str, Any]:
    """`ip:port`, or `unix:/path` for a picker on the same machine (an Envoy `pipe`)."""
    if picker.startswith("unix:"):
        path = picker.removeprefix("unix:")
        if not path.startswith("/"):
            raise ValueError(f"the picker's Unix socket must be an absolute path, got `{picker}`")
        return {"pipe": {"path": path}}
    return _address(picker)


def _picker_cluster(spec: GatewaySpec) -> dict[str, Any]:
    """The pickers: each one's readiness is health-checked (the Endpoint Picker Protocol's
    `envoy.service.ext_proc.v3.ExternalProcessor` health service) and a picker that refuses
    connections is ejected at once, so with several replicas a dead one costs no request.
    With one picker it is always tried (the failure mode decides what a failure means)."""
    pickers = spec.pickers or (spec.picker,)
    cluster: dict[str, Any] = {
        "name": PICKER_CLUSTER, "type": "STATIC", "connect_timeout": "1s",
        "typed_extension_protocol_options": _h2(),
        "load_assignment": {"cluster_name": PICKER_CLUSTER, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": _picker_address(p)}} for p in pickers]}]},
        "health_checks": [{"timeout": "0.25s", "interval": "0.5s", "unhealthy_threshold": 1, "healthy_threshold": 1,
                           "no_traffic_interval": "0.5s",
                           "grpc_health_check": {"service_name": "envoy.service.ext_proc.v3.ExternalProcessor"}}],
        "circuit_breakers": bounds.picker_circuit_breaker(spec.limits),  # beyond: 429 at once, never a late 503
        "outlier_detection": {"split_external_local_origin_errors": True, "consecutive_local_origin_failure": 1,
                              "enforcing_consecutive_local_origin_failure": 100, "base_ejection_time": "5s",
                              "max_ejection_percent": 100, "interval": "0.5s"},
    }
    if len(pickers) > 1:  # never a known-unhealthy replica while another is healthy
        cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": 0}}
    return cluster


def _ext_proc(spec: GatewaySpec) -> dict[str, Any]:
    """The picker. It sees each request's headers (Envoy waits for the pick). With
    `breaks_from_access_log` that is all: it learns breaks from the access log, so the
    response phase is off (one message each way per call). Without, for a request that can
    break (one with a budget) it also sees the answer's headers: which host answered on
    which attempt; for the others it turns the response phase off per request
    (`mode_override`, allowed by `allow_mode_override`)."""
    return {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": PICKER_CLUSTER}, "timeout": f"{spec.picker_timeout_ms / 1000:g}s"},
        "failure_mode_allow": spec.failure_mode_allow,
        "status_on_error": {"code": 503},  # picker unreachable or failing, in the deny mode: Service Unavailable
        "message_timeout": f"{spec.picker_timeout_ms / 1000:g}s",
        "allow_mode_override": True,
        "processing_mode": {"request_header_mode": "SEND",
                            "response_header_mode": "SKIP" if spec.breaks_from_access_log else "SEND",
                            "request_body_mode": "NONE", "response_body_mode": "NONE",
                            "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"},
        "mutation_rules": {"allow_envoy": True},  # the picker sets x-envoy-upstream-rq-per-try-timeout-ms
        # the served host (`envoy.lb`) goes to the picker only for its response phase
        # the Endpoint Picker Protocol's candidate subset (`envoy.lb.subset_hint`), set by a filter before this one
        "metadata_options": {"receiving_namespaces": {"untyped": [LB_NAMESPACE, WATCH_NAMESPACE]},
                             "forwarding_namespaces": {"untyped": [SUBSET_NAMESPACE] + ([] if spec.breaks_from_access_log
                                                                                       else [LB_NAMESPACE])}},
    }}


def _access_log(spec: GatewaySpec, log_name: str = "policyc") -> list[dict[str, Any]]:
    """Envoy's gRPC access-log service pointed at policyc's receiver (`gateway/access_log.py`):
    `policyc` is the connection manager's log (one entry per call), `policyc_upstream` the
    router's (one per attempt, with the model server's compute-time header). Without
    `log_every_call`, what the picker needs alone: the calls it marked breakable
    (`WATCH_NAMESPACE`; the entry's attempt count and answering host say whether Envoy broke
    and retried it) and the attempts Envoy broke (per-try timeout, reset: the router's log
    does not see the call's metadata, so it is filtered by Envoy's response flags). Without
    `log_every_attempt`, the router's log is filtered so too (the receiver reads the answering
    attempt from the call's entry)."""
    if spec.access_log_cluster is None:
        return []
    only: dict[str, Any] = {}
    if log_name == "policyc_upstream" and not (spec.log_every_call and spec.log_every_attempt):
        only = {"filter": {"response_flag_filter": {"flags": list(BROKEN_ATTEMPT_FLAGS)}}}
    elif log_name != "policyc_upstream" and not spec.log_every_call:
        only = {"filter": {"metadata_filter": {"matcher": {"filter": WATCH_NAMESPACE, "path": [{"key": WATCH_KEY}],
                                                           "value": {"bool_match": True}},
                                               "match_if_key_not_found": False}}}
    return [{"name": "envoy.access_loggers.http_grpc", **only, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
        "common_config": {"log_name": log_name, "transport_api_version": "V3",
                          "grpc_service": {"envoy_grpc": {"cluster_name": ALS_CLUSTER}},
                          "buffer_flush_interval": f"{spec.access_log_flush_ms / 1000:g}s",
                          "buffer_size_bytes": ALS_BUFFER_BYTES},
        "additional_request_headers_to_log": [DECISION_HEADER, TLS_HANDSHAKE_HEADER,
                                              *([TRACEPARENT] if spec.otlp_endpoint is not None else [])],
        "additional_response_headers_to_log": ["x-policyc-compute-us", "x-policyc-instance", "x-policyc-variant", "grpc-status",
                                               UPSTREAM_CONNECT_HEADER, UPSTREAM_CONNECTION_HEADER],
        "additional_response_trailers_to_log": ["grpc-status"]}}]


def _route(spec: GatewaySpec) -> dict[str, Any]:
    route: dict[str, Any] = {"cluster": POOL_CLUSTER, "timeout": f"{spec.route_timeout_ms / 1000:g}s"}
    if spec.use_picker and spec.retries > 0:
        # a per-try timeout counts as a retriable reset: Envoy resets that stream, tries the next host
        route["retry_policy"] = {"retry_on": "reset,connect-failure,refused-stream", "num_retries": spec.retries}
    headers = [{"header": {"key": DECISION_HEADER, "value": f"%REQ({DECISION_HEADER})%"}, "keep_empty_value": False}]
    headers += [{"header": {"key": k, "value": v}} for k, v in spec.extra_response_headers]
    answer_headers: list[dict[str, Any]] = headers if spec.use_picker else []
    if spec.access_log_cluster is not None:
        # set once the upstream answered, so its connection is known; the connection manager's log reads them
        answer_headers = answer_headers + [
            {"header": {"key": UPSTREAM_CONNECT_HEADER, "value": "%COMMON_DURATION(US_CX_BEG:US_CX_END:us)%"},
             "keep_empty_value": False},
            {"header": {"key": UPSTREAM_CONNECTION_HEADER, "value": "%UPSTREAM_CONNECTION_ID%"}, "keep_empty_value": False}]
    out: dict[str, Any] = {"match": {"prefix": "/"}, "route": route, "response_headers_to_add": answer_headers,
                           # a retry's markers come from the gateway alone (the Lua filter, on attempts after the
                           # first): a client's own would get the backup's simplified variant on a first attempt
                           "request_headers_to_remove": list(CLIENT_RETRY_MARKS)}
    if spec.tls_cert is not None and spec.access_log_cluster is not None:
        # the connection's TLS handshake time (µs from its start), onto the request so the access log carries it
        out["request_headers_to_add"] = [{"header": {"key": TLS_HANDSHAKE_HEADER, "value": "%COMMON_DURATION(DS_CX_BEG:DS_HS_END:us)%"},
                                          "keep_empty_value": False}]
    return out


def _routes(spec: GatewaySpec) -> list[dict[str, Any]]:
    """The catch-all route, after the LLM routes when the gateway has them (`llm_routes`)."""
    if spec.llm is None:
        return [_route(spec)]
    return llm_routes(spec.llm, _route(spec), not spec.breaks_from_access_log)


def _tracing(spec: GatewaySpec) -> dict[str, Any]:
    """Envoy's OpenTelemetry tracer: a span per request, continuing the client's W3C
    `traceparent` (a new trace without one), its context sent on to the picker (the ext_proc
    call's gRPC metadata) and to the model server (the upstream request's headers); spans
    exported over OTLP/gRPC to `otlp_endpoint`. A client's traceparent decides whether its
    request is sampled; `otlp_sampling` percent of the others are (tracing is opt-in)."""
    return {"tracing": {"random_sampling": {"value": spec.otlp_sampling}, "spawn_upstream_span": True, "provider": {
        "name": "envoy.tracers.opentelemetry", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
            "grpc_service": {"envoy_grpc": {"cluster_name": OTLP_CLUSTER}, "timeout": "1s"},
            "service_name": "policyc-gateway"}}}}


def _tls(spec: GatewaySpec) -> dict[str, Any]:
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": {"alpn_protocols": ["h2", "http/1.1"],
                               "tls_certificates": [{"certificate_chain": {"filename": spec.tls_cert},
                                                     "private_key": {"filename": spec.tls_key}}]}}}


def build_bootstrap(spec: GatewaySpec) -> dict[str, Any]:
    """The whole bootstrap for `spec` (raises ValueError naming a bad address)."""
    if spec.eds_path is None and not spec.endpoints:
        raise ValueError("a gateway needs its pool: give `endpoints` or `eds_path`")
    if spec.retries < 0:
        raise ValueError(f"retries must be at least 0, got {spec.retries}")
    if (spec.tls_cert is None) != (spec.tls_key is None):
        raise ValueError("a TLS listener needs both tls_cert and tls_key")
    if spec.breaks_from_access_log and spec.access_log_cluster is None:
        raise ValueError("breaks_from_access_log needs the access log: give access_log_cluster")
    if not spec.log_every_call and not spec.breaks_from_access_log:
        raise ValueError("log_every_call=False logs only what the picker needs: it needs breaks_from_access_log")
    if not 1 <= spec.access_log_flush_ms <= 10_000:
        raise ValueError(f"access_log_flush_ms must be 1-10000 ms, got {spec.access_log_flush_ms}")
    if not 0.0 <= spec.otlp_sampling <= 100.0:
        raise ValueError(f"otlp_sampling must be a percentage in [0, 100], got {spec.otlp_sampling}")
    if spec.retry_budget is not None and not 0.0 <= spec.retry_budget <= 1.0:
        raise ValueError(f"retry_budget must be a share in [0, 1], got {spec.retry_budget}")
    spec.limits.check()
    http_filters = ([_ext_proc(spec)] if spec.use_picker else []) + [
        {"name": "envoy.filters.http.router",
         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                          **({"upstream_log": _access_log(spec, "policyc_upstream")} if spec.access_log_cluster else {})}}]
    if spec.llm is not None and spec.use_picker:  # the body-reading routes' own filter, after the general one
        http_filters.insert(1, llm_picker_filter(http_filters[0], spec.llm, not spec.breaks_from_access_log))
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": LISTENER,
        "codec_type": "AUTO",
        "route_config": {"name": LISTENER, "virtual_hosts": [{
            "name": "pool", "domains": ["*"],
            "include_request_attempt_count": True, "include_attempt_count_in_response": True,
            "routes": _routes(spec)}]},
        "http_filters": http_filters,
        "access_log": _access_log(spec),
        **bounds.connection_manager_options(spec.limits),
        **(_tracing(spec) if spec.otlp_endpoint is not None else {}),
    }
    clusters = [_pool_cluster(spec)]
    if spec.llm is not None:
        clusters += llm_clusters(clusters[0], spec.llm)
        _add_connection_manager_options(hcm, llm_listener_limits(spec.llm))
    if spec.use_picker:
        clusters.append(_picker_cluster(spec))
    if spec.otlp_endpoint is not None:
        clusters.append({"name": OTLP_CLUSTER, "type": "STATIC", "connect_timeout": "1s",
                         "typed_extension_protocol_options": _h2(),
                         "load_assignment": load_assignment(OTLP_CLUSTER, (spec.otlp_endpoint,))})
    if spec.access_log_cluster is not None:
        clusters.append({"name": ALS_CLUSTER, "type": "STATIC", "connect_timeout": "1s",
                         "typed_extension_protocol_options": _h2(),
                         "load_assignment": load_assignment(ALS_CLUSTER, (spec.access_log_cluster,))})
    return {
        "node": {"id": spec.node_id, "cluster": "policyc"},
        "admin": {"address": _admin_address(spec.admin)},
        "static_resources": {
            "listeners": [{"name": LISTENER, "address": _address(spec.listen), **bounds.listener_options(spec.limits),
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                           "typed_config": hcm}],
                                              **({"transport_socket": _tls(spec)} if spec.tls_cert else {})}]}],
            "clusters": clusters,
        },
        "overload_manager": bounds.overload_manager(spec.limits),
        **({"layered_runtime": _tracing_runtime()} if spec.otlp_endpoint is not None else {}),
    }


def _tracing_runtime() -> dict[str, Any]:
    """Envoy's OpenTelemetry tracer exports every 5 spans by default (a gRPC call every other
    request, ~+170 µs of Envoy's CPU a request, benchmarks/RESULTS.md): export in batches of
    up to 1,024 spans, at least every 200 ms (a trace is at the collector as soon as before)."""
    return {"layers": [{"name": "policyc-tracing", "static_layer": {
        "tracing.opentelemetry.min_flush_spans": 1024, "tracing.opentelemetry.flush_interval_ms": 200}}]}


def _add_connection_manager_options(hcm: dict[str, Any], options: dict[str, Any]) -> None:
    """`options` into the connection manager; their local-reply mappers go before the
    general ones (`limits.local_reply_mappers`: the first that matches applies)."""
    options = dict(options)
    mappers = options.pop("local_reply_config", {}).get("mappers", [])
    hcm.update(options)
    hcm.setdefault("local_reply_config", {}).setdefault("mappers", [])[:0] = mappers


def _admin_address(admin: str) -> dict[str, Any]:
    """Envoy's admin interface (`/quitquitquit`, `/config_dump`, ...) on a loopback address
    only: no route leads there, and no other host can reach it."""
    address = _address(admin)
    if not ipaddress.ip_address(address["socket_address"]["address"]).is_loopback:
        raise ValueError(f"the admin address `{admin}` is not a loopback address: Envoy's admin interface can stop it "
                         "and read its configuration, so it listens on loopback only (e.g. 127.0.0.1:9901)")
    return address
