"""Every kind of bad input gets a precise status and message, and the server keeps serving."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from policyc.server import convert
from policyc.server.proto import pb


def _refused(call, req, **kw) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(req, **kw)
    return info.value


def _still_serving(channel, stub) -> None:  # type: ignore[no-untyped-def]
    h = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    assert stub.Decide(pb.DecideRequest(headers={"X-Model": "fraud-scorer-lite"})).outcome == pb.ADMITTED


def test_malformed_header_names_the_header_and_problem(stub, channel) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-SLO-Latency": "fast", "X-Data-Region": "us-west"}))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == "header `X-SLO-Latency`: `fast` is not a time (ns, us, ms, s, min)"
    _still_serving(channel, stub)


def test_every_bad_header_is_reported_at_once(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-SLO-Latency": "5 GB/s", "X-Data-Regoin": "us-west"}))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
    problems = [v for k, v in e.trailing_metadata() if k == "policyc-problem"]
    assert len(problems) == 2
    assert any("did you mean `X-Data-Region`" in p for p in problems)
    assert any("X-SLO-Latency" in p and "bandwidth" in p for p in problems)


def test_out_of_range_value_is_invalid(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-SLO-Latency": "5min"}))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "out of range 1 ms .. 60 s" in e.details()


def test_unknown_tenant_is_not_found_with_a_suggestion(stub, channel) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-Tenant": "acme-bnak"}))
    assert e.code() is grpc.StatusCode.NOT_FOUND
    assert e.details() == "header `X-Tenant`: unknown tenant `acme-bnak`; did you mean `acme-bank`?"
    e = _refused(stub.Decide, pb.DecideRequest(tenant="nobody"))
    assert e.code() is grpc.StatusCode.NOT_FOUND and "unknown tenant `nobody`" in e.details()
    _still_serving(channel, stub)


def test_tenant_header_disagreeing_with_the_caller_is_refused(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(tenant="acme-bank", headers={"X-Tenant": "shopwave"}))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "authenticated as `acme-bank`" in e.details()


def test_ill_typed_and_unknown_attributes(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(attributes=convert.attributes_msg({"slo": "fast"})))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "attribute `slo`: expected a number (SI units) for a `time` variable" in e.details()
    e = _refused(stub.Decide, pb.DecideRequest(attributes=convert.attributes_msg({"regoin": "us-west"})))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "did you mean `region`?" in e.details()
    e = _refused(stub.Decide, pb.DecideRequest(attributes={"region": pb.Value()}))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "attribute `region`: no value" in e.details()


def test_bad_retry_count_header(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-Retry-Count": "twice"}))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "X-Retry-Count" in e.details()


def test_oversize_decide_is_resource_exhausted(stub, channel) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-Model": "x" * 70_000}))
    assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "a Decide/Explain request may be at most 65536" in e.details()
    _still_serving(channel, stub)


def test_message_over_the_transport_limit_is_resource_exhausted(stub, channel) -> None:
    e = _refused(stub.RegisterInstance, pb.RegisterInstanceRequest(id="huge", onnx_model=b"\0" * (33 * 1024 * 1024)))
    assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_serving(channel, stub)


def test_too_many_headers(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={f"x-request-id-{i}": "1" for i in range(65)}))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "too many headers: 65" in e.details()


def test_expired_deadline_is_deadline_exceeded_and_serving_continues(stub, channel) -> None:
    # gRPC's deadline timer is coarse: on loopback a reply can beat a 1 µs deadline now and then,
    # so try a few times; any call that fails must fail with DEADLINE_EXCEEDED.
    codes = []
    for _ in range(20):
        try:
            stub.Decide(pb.DecideRequest(headers={"X-Model": "fraud-scorer-lite"}), timeout=1e-6)
        except grpc.RpcError as e:
            codes.append(e.code())
        if len(codes) >= 3:
            break
    assert codes and set(codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}
    _still_serving(channel, stub)


def test_servicer_refuses_a_request_whose_deadline_already_passed() -> None:
    from policyc.server.errors import ServiceError, Status
    from policyc.server.service import DecisionService

    class Expired:
        def time_remaining(self) -> float:
            return 0.0

    class NoTokens:
        enabled = False

    svc = DecisionService.__new__(DecisionService)
    svc.tokens, svc.max_decide_bytes = NoTokens(), 1024
    with pytest.raises(ServiceError) as info:
        svc._admit(Expired(), permission=None)  # type: ignore[arg-type]
    assert info.value.status is Status.DEADLINE_EXCEEDED
    assert info.value.message == "the deadline expired before the decision started"
