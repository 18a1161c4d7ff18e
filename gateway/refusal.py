"""When the picker must not forward: the HTTP status, the gRPC status for gRPC callers, and
the reason, following the Endpoint Picker Protocol (503: no endpoint can serve; 429: the
request is shed) and the decision service's own refusals:

| cause | HTTP | gRPC |
| --- | --- | --- |
| bad, unknown or misspelt header, unknown tenant ("did you mean") | 400 | INVALID_ARGUMENT |
| a rule excludes every instance (solver or matcher), named with its origin | 403 | PERMISSION_DENIED |
| no instance can serve (none registered with an endpoint, no GPU can place it) | 503 | UNAVAILABLE |
| the audit log refuses (it fails closed) | 503 | UNAVAILABLE |
| too many requests in flight through the picker | 429 | RESOURCE_EXHAUSTED |
| more request headers, or header bytes, than the gateway takes | 431 | RESOURCE_EXHAUSTED |
"""

from __future__ import annotations

from dataclasses import dataclass

from policyc.server.decision import Decision, Stage
from policyc.server.errors import ServiceError, Status

GRPC_OK, GRPC_INVALID_ARGUMENT, GRPC_PERMISSION_DENIED = 0, 3, 7
GRPC_RESOURCE_EXHAUSTED, GRPC_INTERNAL, GRPC_UNAVAILABLE = 8, 13, 14

_BY_STATUS = {
    Status.INVALID_ARGUMENT: (400, GRPC_INVALID_ARGUMENT),
    Status.NOT_FOUND: (400, GRPC_INVALID_ARGUMENT),  # an unknown tenant is a bad header value here
    Status.PERMISSION_DENIED: (403, GRPC_PERMISSION_DENIED),
    Status.UNAUTHENTICATED: (403, GRPC_PERMISSION_DENIED),
    Status.RESOURCE_EXHAUSTED: (429, GRPC_RESOURCE_EXHAUSTED),
    Status.UNAVAILABLE: (503, GRPC_UNAVAILABLE),
    Status.DEADLINE_EXCEEDED: (503, GRPC_UNAVAILABLE),
}


@dataclass(frozen=True, slots=True)
class Refusal:
    http_status: int
    grpc_status: int
    reason: str  # one line, for people: also the gRPC message
    cause: str  # `bad-header`, `rule`, `no-instance`, `audit`, `shed`, `internal`
    decision_id: str = ""
    rules: tuple[str, ...] = ()  # the rules that reject, by id
    problems: tuple[str, ...] = ()  # one per bad header


def ascii_line(text: str, limit: int = 1000) -> str:
    """Header values are printable ASCII on one line; keep the message readable anyway."""
    text = text.replace("…", "...").replace("→", "->").replace("\n", " ").replace("\r", " ")
    return text.encode("ascii", "replace").decode()[:limit]


def from_error(e: ServiceError) -> Refusal:
    http, grpc_code = _BY_STATUS.get(e.status, (500, GRPC_INTERNAL))
    cause = "bad-header" if http == 400 else "audit" if e.status is Status.UNAVAILABLE else "shed" if http == 429 \
        else "internal" if http == 500 else "rule"
    return Refusal(http, grpc_code, e.message, cause, problems=tuple(e.details))


def from_rejection(d: Decision) -> Refusal:
    """A rejected decision: 403 when rules exclude every instance (they are named), 503
    when nothing can serve it (no instance, no GPU with room)."""
    r = d.rejection
    assert r is not None
    if r.rule_ids and r.stage in (Stage.FEASIBILITY, Stage.MATCH):
        return Refusal(403, GRPC_PERMISSION_DENIED, f"rejected by {', '.join(f'`{i}`' for i in r.rule_ids)}: {r.reason}",
                       "rule", d.decision_id, tuple(r.rule_ids))
    return Refusal(503, GRPC_UNAVAILABLE, f"no instance can serve this request ({r.stage.value}): {r.reason}",
                   "no-instance", d.decision_id)


def outside_subset(d: Decision) -> Refusal:
    """No admissible instance in the gateway's candidate subset: 503, as the Endpoint Picker
    Protocol asks, with the decision's reason (its rules' or the subset's)."""
    r = d.rejection
    assert r is not None
    if r.stage is Stage.FEASIBILITY:  # the policy refuses the request wherever it would go
        return from_rejection(d)
    return Refusal(503, GRPC_UNAVAILABLE, f"no endpoint of the gateway's candidate subset can serve this request "
                   f"({r.stage.value}): {r.reason}", "subset", d.decision_id, r.rule_ids)


def no_endpoint(d: Decision, unpublished: bool = False) -> Refusal:
    """Admitted on an instance the gateway cannot reach: one without an endpoint (never
    chosen for a gateway request; a guard so such a decision never becomes traffic) or one
    registered a moment ago whose endpoint Envoy has not loaded yet."""
    who = d.plan.instance_id if d.plan is not None else "?"
    why = f"Envoy has not loaded its endpoint {d.endpoint} yet" if unpublished else "it has no endpoint"
    return Refusal(503, GRPC_UNAVAILABLE, f"instance `{who}` cannot take gateway traffic: {why}", "no-instance", d.decision_id)


def shed(in_flight: int, limit: int) -> Refusal:
    return Refusal(429, GRPC_RESOURCE_EXHAUSTED,
                   f"shedding: {in_flight} requests in flight through the picker, the limit is {limit}", "shed")


def headers_too_large(count: int, size: int, max_count: int, max_bytes: int) -> Refusal:
    """More request headers, or more header bytes, than the gateway takes (HTTP 431, as
    Envoy's HTTP/1.1 codec answers; its HTTP/2 codec would reset the stream instead)."""
    return Refusal(431, GRPC_RESOURCE_EXHAUSTED,
                   f"request headers too large: {count} headers, {size} bytes; the gateway takes at most {max_count} "
                   f"headers and {max_bytes} bytes (policyc gateway --max-headers-count, --max-request-headers-kb)",
                   "headers-too-large")


def internal(what: str) -> Refusal:
    return Refusal(500, GRPC_INTERNAL, f"internal error in the endpoint picker: {what}", "internal")
