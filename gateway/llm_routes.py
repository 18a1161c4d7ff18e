"""The gateway's LLM routes, for the bootstrap (`GatewaySpec.llm`): what Envoy does with
OpenAI-style and Open Inference Protocol REST traffic besides the gRPC it always routed.

- `/v1/chat/completions` and `/v1/completions`: the picker reads the body (the model and the
  prompt are in it), so these routes have an ext_proc filter of their own (`LLM_PICKER_FILTER`,
  the same picker; the general one is off there, and this one off elsewhere) that sends it,
  with its own message timeout (`picker_timeout_ms`: counting a 220 KB prompt's tokens takes
  longer than a gRPC call's pick may), FULL_DUPLEX_STREAMED: Envoy sends the headers and
  the body's chunks as they arrive without waiting for the headers' answer; the picker reads
  the body to its end (refusing it with 413 once over `max_body_bytes`), then answers the
  headers with the pick and gives the body back (one exchange with the picker where
  BUFFERED took two: the headers answered, then the body sent); a body that takes longer than `body_timeout_ms` to arrive gets 408
  (the connection manager's request timeout). Both answers carry the reason in
  `x-policyc-reason` and an OpenAI-style error object (local-reply mappers).
- `/v1/models`, the OIP REST paths (`/v2/...`) and everything else: headers only, as before.
- Every route exists twice: to the HTTP/1.1 pool (`POOL_HTTP1_CLUSTER`) when the picker set
  `x-policyc-upstream: http1` (the picked endpoint was registered as speaking HTTP/1.1, as
  vLLM's OpenAI server does) and cleared the route cache, else to the HTTP/2 pool as before.
  A client's own `x-policyc-upstream` is removed by the picker; both pools hold every
  endpoint, so a client that forges it can only fail its own request. The header never
  reaches the model server.
- Responses stream through as the server sends them (Envoy buffers no response body here):
  a server-sent event reaches the client as soon as the model server writes it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

UPSTREAM_HEADER = "x-policyc-upstream"
HTTP1, H2 = "http1", "h2"
PROTOCOLS = (H2, HTTP1)
PROTOCOL_LABEL = "endpoint_protocol"  # an instance's label: how its endpoint speaks (`h2` when absent)
POOL_HTTP1_CLUSTER = "policyc_pool_http1"
BODY_PREFIXES = ("/v1/chat/completions", "/v1/completions")
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
LLM_PICKER_FILTER = "policyc.llm_picker"  # the picker's filter on the body-reading routes
_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
REASON_HEADER = "x-policyc-reason"


@dataclass(frozen=True, slots=True)
class LlmRoutes:
    max_body_bytes: int = 4 << 20  # a 220 KB prompt fits many times; beyond: 413
    body_timeout_ms: int = 10_000  # the whole request received within this; beyond: 408
    eds_path_http1: str | None = None  # the HTTP/1.1 pool's EDS file (None: the inline endpoints)
    # `ip:port` of the stream supervisor (gateway/llm_stream.py), an upstream ext_proc filter on the
    # HTTP/1.1 pool: first tokens held to their TTFT budget, streams to their TPOT budget, tokens and
    # times measured. None: answers pass unsupervised (no TTFT break on streams, no TPOT end, no evidence)
    supervisor: str | None = None
    supervisor_timeout_ms: int = 5000  # per message to the supervisor (it answers at once; a loaded machine's stall)
    picker_timeout_ms: int = 5000  # the picker's time on a body-reading route's request, after its body is in


def _processing_mode(response_headers: bool) -> dict[str, Any]:
    return {"request_header_mode": "SEND", "response_header_mode": "SEND" if response_headers else "SKIP",
            "request_body_mode": "FULL_DUPLEX_STREAMED", "response_body_mode": "NONE",
            "request_trailer_mode": "SEND", "response_trailer_mode": "SKIP"}


def _twice(route: dict[str, Any]) -> list[dict[str, Any]]:
    """`route` to the HTTP/1.1 pool when the picker says so, then as it is (the HTTP/2 pool)."""
    h1 = copy.deepcopy(route)
    h1["match"] = {**h1["match"], "headers": [{"name": UPSTREAM_HEADER, "string_match": {"exact": HTTP1}}]}
    h1["route"]["cluster"] = POOL_HTTP1_CLUSTER
    out = []
    for r in (h1, copy.deepcopy(route)):
        r["request_headers_to_remove"] = [*r.get("request_headers_to_remove", []), UPSTREAM_HEADER]
        out.append(r)
    return out


def llm_routes(limits: LlmRoutes, base: dict[str, Any], response_headers: bool) -> list[dict[str, Any]]:
    """The routes: the body-reading ones first, then `base` (the catch-all), each twice.
    `response_headers`: whether the picker also sees answers' headers (as the filter says)."""
    routes: list[dict[str, Any]] = []
    for prefix in BODY_PREFIXES:
        r = copy.deepcopy(base)
        r["match"] = {"path": prefix}
        r["request_body_buffer_limit"] = str(limits.max_body_bytes)
        r["typed_per_filter_config"] = {EXT_PROC_FILTER: {"@type": _PER_ROUTE, "disabled": True}}
        routes += _twice(r)
    rest = copy.deepcopy(base)
    rest["typed_per_filter_config"] = {**rest.get("typed_per_filter_config", {}),
                                       LLM_PICKER_FILTER: {"@type": _PER_ROUTE, "disabled": True}}
    return routes + _twice(rest)


def llm_picker_filter(general: dict[str, Any], limits: LlmRoutes, response_headers: bool) -> dict[str, Any]:
    """The picker's filter for the body-reading routes: the general one's, with the body
    sent full duplex and its own message timeout."""
    f = copy.deepcopy(general)
    f["name"] = LLM_PICKER_FILTER
    cfg = f["typed_config"]
    # full duplex: the headers' answer (the pick) comes once the whole body is in, so its bound is
    # the body's own (`body_timeout_ms`, then 408) plus the picker's time on it
    t = f"{(limits.body_timeout_ms + limits.picker_timeout_ms) / 1000:g}s"
    cfg["message_timeout"] = t
    cfg["grpc_service"]["timeout"] = t
    cfg["processing_mode"] = _processing_mode(response_headers)
    return f


SUPERVISOR_CLUSTER = "policyc_llm_supervisor"
SUPERVISOR_FILTER = "policyc.llm_supervisor"


def _supervisor_filter(limits: LlmRoutes) -> dict[str, Any]:
    """The upstream ext_proc filter: each attempt's request headers (the decision id), its
    answer's headers (held until the first body chunk) and body, full duplex (the
    supervisor may end a stalled stream with a body of its own)."""
    t = f"{limits.supervisor_timeout_ms / 1000:g}s"
    # its own name: the LLM routes' per-route ext_proc override (body full duplex) is the picker's alone
    return {"name": SUPERVISOR_FILTER, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": SUPERVISOR_CLUSTER}, "timeout": t},
        "failure_mode_allow": False,
        "message_timeout": t,
        "allow_mode_override": True,
        "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                            "request_body_mode": "NONE", "response_body_mode": "FULL_DUPLEX_STREAMED",
                            "request_trailer_mode": "SKIP", "response_trailer_mode": "SEND"}}}


def llm_clusters(h2_pool: dict[str, Any], limits: LlmRoutes) -> list[dict[str, Any]]:
    """The HTTP/1.1 pool and, with a supervisor, its cluster."""
    out = [http1_pool_cluster(h2_pool, limits)]
    if limits.supervisor is not None:
        host, _, port = limits.supervisor.rpartition(":")
        out.append({"name": SUPERVISOR_CLUSTER, "type": "STATIC", "connect_timeout": "1s",
                    "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}}},
                    "load_assignment": {"cluster_name": SUPERVISOR_CLUSTER, "endpoints": [{"lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": host.strip("[]"),
                                                                     "port_value": int(port)}}}}]}]}})
    return out


def http1_pool_cluster(h2_pool: dict[str, Any], limits: LlmRoutes) -> dict[str, Any]:
    """The HTTP/2 pool's cluster made HTTP/1.1: the same balancer (the picker's override host),
    the same per-attempt filters, the same endpoints (its own EDS file, same content)."""
    c = copy.deepcopy(h2_pool)
    c["name"] = POOL_HTTP1_CLUSTER
    opts = c["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    opts["explicit_http_config"] = {"http_protocol_options": {}}
    if limits.supervisor is not None and "http_filters" in opts:  # before the codec, after the retry headers
        opts["http_filters"].insert(len(opts["http_filters"]) - 1, _supervisor_filter(limits))
    if "load_assignment" in c:
        c["load_assignment"]["cluster_name"] = POOL_HTTP1_CLUSTER
    if "eds_cluster_config" in c:
        if limits.eds_path_http1 is None:
            raise ValueError("an EDS pool with LLM routes needs `eds_path_http1` for its HTTP/1.1 pool")
        c["eds_cluster_config"] = {"eds_config": {"path_config_source": {"path": limits.eds_path_http1},
                                                  "resource_api_version": "V3"}}
    return c


def _error_mapper(status: int, reason: str, code: str, body: bool) -> dict[str, Any]:
    """Envoy's own `status` answers get `reason` (a picker's answer of that status keeps its
    own reason: the header is added only where absent). `body`: the OpenAI error object as
    the body too (only for a status the picker never answers with: the mapper cannot tell)."""
    mapper: dict[str, Any] = {
        "filter": {"status_code_filter": {"comparison": {
            "op": "EQ", "value": {"default_value": status, "runtime_key": f"policyc.llm.local_reply_{status}"}}}},
        "headers_to_add": [{"header": {"key": REASON_HEADER, "value": reason}, "append_action": "ADD_IF_ABSENT"}]}
    if body:
        mapper["body"] = {"inline_string": json.dumps(
            {"error": {"message": reason, "type": "invalid_request_error", "param": None, "code": code}})}
        mapper["headers_to_add"].append({"header": {"key": "content-type", "value": "application/json"},
                                         "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"})
    return mapper


def llm_listener_limits(limits: LlmRoutes) -> dict[str, Any]:
    """The connection manager's part: the time limit on receiving a request (408) and the
    reasons Envoy's own 413 and 408 answers carry."""
    if not 1 <= limits.max_body_bytes <= 64 << 20:
        raise ValueError(f"max_body_bytes must be 1 B .. 64 MiB, got {limits.max_body_bytes}")
    if not 1 <= limits.body_timeout_ms <= 600_000:
        raise ValueError(f"body_timeout_ms must be 1 ms .. 600 s, got {limits.body_timeout_ms}")
    return {"request_timeout": f"{limits.body_timeout_ms / 1000:g}s",
            "local_reply_config": {"mappers": [
                _error_mapper(413, "the request body is over what the gateway buffers for one request "
                                   "(its listener's per-connection buffer)", "request_too_large", body=False),
                _error_mapper(408, f"the request was not received within the gateway's {limits.body_timeout_ms} ms",
                              "request_timeout", body=True)]}}
