"""The ext_proc messages the picker sends Envoy (`envoy.service.ext_proc.v3`), built in one
place: forward with the pick, refuse with an immediate response, let a phase continue."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from .bootstrap import (CLIENT_RETRY_MARKS, DECISION_HEADER, ENDPOINT_KEY, LB_NAMESPACE, MAX_RETRIES, PER_TRY_TIMEOUT, RETRY_HEADERS,
                        WATCH_KEY, WATCH_NAMESPACE)
from .pick import Pick
from .refusal import Refusal, ascii_line

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
REASON_HEADER = "x-policyc-reason"
RULE_HEADER = "x-policyc-rule"
CAUSE_HEADER = "x-policyc-refusal"

CONTINUE_RESPONSE_HEADERS = ep.ProcessingResponse(response_headers=ep.HeadersResponse())
# Headers by which a client could steer Envoy's routing of its own request (more retries,
# which would send it to a host the override-host balancer did not get from the picker;
# its own timeouts; per-attempt headers for the Lua filter): removed unless the picker sets them.
CLIENT_CONTROLS = ("x-envoy-retry-on", "x-envoy-retry-grpc-on", "x-envoy-retriable-status-codes",
                   "x-envoy-retriable-header-names", "x-envoy-upstream-rq-timeout-ms", "x-envoy-hedge-on-per-try-timeout",
                   "x-envoy-upstream-rq-timeout-alt-response")


def _set(mutation: "base_pb2.HeaderMutation", key: str, value: str) -> None:  # type: ignore[name-defined]
    mutation.set_headers.add(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE)


_HEADS: dict[tuple[str, int | None, str, int, bool, bool], bytes] = {}
_HEADS_MAX = 1024


def forward_bytes(pick: Pick, see_answer: bool, watch: bool) -> bytes:
    """`forward(pick, see_answer=..., watch=...)` serialized, the part every pick of the same endpoints,
    budget and retry shares built once: protobuf reads concatenated messages as one merged
    message, so the decision id's header, serialized alone, joins the same header mutation.
    A planned pick keeps its heads on its route (a look-up by its budget); one built by hand,
    in a table keyed by what the head holds."""
    route = pick.route
    if route is not None:
        head = route.heads.get((pick.per_try_timeout_ms, see_answer, watch))
        if head is None:
            if len(route.heads) >= _HEADS_MAX:
                route.heads.clear()
            head = route.heads[(pick.per_try_timeout_ms, see_answer, watch)] = forward(
                pick, with_decision_id=False, see_answer=see_answer, watch=watch).SerializeToString()
        return head + _decision_id_bytes(pick.decision_id)
    key = (pick.endpoints, pick.per_try_timeout_ms, pick.retry_headers_value, len(pick.fallbacks), see_answer, watch)
    head = _HEADS.get(key)
    if head is None:
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        head = _HEADS[key] = forward(pick, with_decision_id=False, see_answer=see_answer, watch=watch).SerializeToString()
    return head + _decision_id_bytes(pick.decision_id)


def _decision_id_message(decision_id: str) -> bytes:
    tail = ep.ProcessingResponse()
    _set(tail.request_headers.response.header_mutation, DECISION_HEADER, decision_id)
    return tail.SerializeToString()


_ID_PLACEHOLDER = "\x00" * 32  # decision ids are 32 hex digits: every such message has the same length prefixes
_ID_BEFORE, _, _ID_AFTER = _decision_id_message(_ID_PLACEHOLDER).partition(_ID_PLACEHOLDER.encode())


def _decision_id_bytes(decision_id: str) -> bytes:
    """The decision id's header mutation, serialized: the id spliced into a message built
    once (the hot path builds no protobuf), any other length built in full."""
    raw = decision_id.encode()
    if len(raw) == len(_ID_PLACEHOLDER):
        return _ID_BEFORE + raw + _ID_AFTER
    return _decision_id_message(decision_id)


def serialize(message: ep.ProcessingResponse | bytes) -> bytes:
    """The picker's response serializer: messages, or bytes already serialized."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def forward(pick: Pick, *, with_decision_id: bool = True, see_answer: bool = False, watch: bool = False) -> ep.ProcessingResponse:
    """Continue upstream: the endpoints in the `envoy.lb` metadata (what the override-host
    load balancer reads) and in `x-gateway-destination-endpoint` (the same value, as the
    protocol asks), the per-try timeout, the retry's headers, the decision id. Unless
    `see_answer` (a picker that learns breaks from the answer's headers, for a request that
    can break), the response phase is turned off for this request. `watch`: the request is
    marked breakable in the dynamic metadata, so an access log kept for the picker logs it."""
    r = ep.ProcessingResponse()
    m = r.request_headers.response.header_mutation
    value = pick.endpoints
    _set(m, ENDPOINT_KEY, value)
    if with_decision_id:
        _set(m, DECISION_HEADER, pick.decision_id)
    m.remove_headers.extend(CLIENT_CONTROLS)
    # the redirect's headers come on the gateway's retry alone (the Lua filter sets them there): a
    # client's own copies are dropped, so no first attempt carries them (`X-Retry-Count: 1`: the backup's
    # simplified variant)
    m.remove_headers.extend(CLIENT_RETRY_MARKS)
    m.remove_headers.extend(k.lower() for k, _ in pick.retry_headers if k.lower() not in CLIENT_RETRY_MARKS)
    if pick.per_try_timeout_ms is not None:
        _set(m, PER_TRY_TIMEOUT, str(pick.per_try_timeout_ms))
    else:
        m.remove_headers.append(PER_TRY_TIMEOUT)
    if pick.fallbacks:
        _set(m, RETRY_HEADERS, pick.retry_headers_value)
        _set(m, MAX_RETRIES, str(len(pick.fallbacks)))  # one retry per fallback, never more
    else:
        m.remove_headers.append(RETRY_HEADERS)
        _set(m, MAX_RETRIES, "0")  # nowhere to redirect: a broken stream ends the request
    md = struct_pb2.Struct()
    md.fields[LB_NAMESPACE].struct_value.fields[ENDPOINT_KEY].string_value = value
    if watch:
        md.fields[WATCH_NAMESPACE].struct_value.fields[WATCH_KEY].bool_value = True
    r.dynamic_metadata.CopyFrom(md)
    if not see_answer:
        r.mode_override.response_header_mode = ProcessingMode.SKIP
    return r


def immediate(refusal: Refusal) -> ep.ProcessingResponse:
    """Answer the client now. gRPC callers get `grpc_status` and the reason as the message
    (Envoy writes the body as `grpc-message`); everyone gets the reason in a header."""
    ir = ep.ImmediateResponse(body=ascii_line(refusal.reason, 4000).encode(), details=f"policyc_{refusal.cause}")
    ir.status.code = refusal.http_status  # type: ignore[assignment]
    ir.grpc_status.status = refusal.grpc_status
    hm = ir.headers
    _set(hm, REASON_HEADER, ascii_line(refusal.reason))
    _set(hm, CAUSE_HEADER, refusal.cause)
    if refusal.decision_id:
        _set(hm, DECISION_HEADER, refusal.decision_id)
    if refusal.rules:
        _set(hm, RULE_HEADER, ",".join(refusal.rules))
    return ep.ProcessingResponse(immediate_response=ir)


def empty_for(kind: str) -> ep.ProcessingResponse:
    """A phase the picker has nothing to say about (bodies, trailers: the bootstrap does not
    ask for them; answered anyway, so a differently configured Envoy does not hang)."""
    r = ep.ProcessingResponse()
    if kind in ep.ProcessingResponse.DESCRIPTOR.fields_by_name and kind.startswith(("request_", "response_")):
        getattr(r, kind).SetInParent()
    return r
