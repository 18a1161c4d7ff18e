"""Refusals are standard rich gRPC errors: `grpc_status.rpc_status.from_call()` finds a
`google.rpc.Status` whose `BadRequest` names the header or field and whose `ErrorInfo`
holds the policyc code, for Decide and for RegisterInstance; `policyc decide` prints the
same problem, with the same code, for the same input."""

from __future__ import annotations

import json

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from policyc.cli.main import main
from policyc.compiler.codes import CODES
from policyc.server.proto import pb


def _details(e: grpc.RpcError) -> tuple[list[error_details_pb2.BadRequest.FieldViolation], error_details_pb2.ErrorInfo]:
    st = rpc_status.from_call(e)
    assert st is not None, "no google.rpc.Status in the trailers"
    assert st.code == e.code().value[0] and st.message == e.details()
    violations: list[error_details_pb2.BadRequest.FieldViolation] = []
    infos = []
    for d in st.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            violations += list(br.field_violations)
        elif d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            infos.append(info)
    assert len(infos) == 1, infos
    return violations, infos[0]


def _refused(call, req) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(req)
    return info.value


def test_a_bad_decide_names_each_header_and_its_code(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-SLO-Latency": "5 GB/s", "X-Data-Regoin": "us-west"}))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
    violations, info = _details(e)
    by_field = {v.field: v for v in violations}
    assert set(by_field) == {"X-SLO-Latency", "X-Data-Regoin"}
    assert by_field["X-SLO-Latency"].reason == "E703" and "bandwidth" in by_field["X-SLO-Latency"].description
    assert by_field["X-Data-Regoin"].reason == "E701" and "did you mean `X-Data-Region`" in by_field["X-Data-Regoin"].description
    assert info.domain == "policyc" and info.reason in {"E701", "E703"}
    assert set(info.metadata["codes"].split(",")) == {"E701", "E703"}
    assert all(code in CODES for code in info.metadata["codes"].split(","))


def test_an_unknown_tenant_is_not_found_with_its_code(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-Tenant": "acme-bnak"}))
    assert e.code() is grpc.StatusCode.NOT_FOUND
    violations, info = _details(e)
    assert [(v.field, v.reason) for v in violations] == [("X-Tenant", "E706")]
    assert info.reason == "E706" and info.metadata["field"] == "X-Tenant"


def test_a_bad_retry_count_has_its_own_code(stub) -> None:
    e = _refused(stub.Decide, pb.DecideRequest(headers={"X-Retry-Count": "-1"}))
    violations, info = _details(e)
    assert info.reason == "E708" and violations[0].field == "headers.X-Retry-Count"


def test_a_refused_registration_names_the_field_and_code(stub) -> None:
    dep = pb.Deployment(host="h-new", gpu="gpu0", gpu_model="H100", region="us-west", numa_node=0)
    e = _refused(stub.RegisterInstance, pb.RegisterInstanceRequest(id="x-1", model="no-such-model", deployment=dep))
    assert e.code() is grpc.StatusCode.NOT_FOUND
    violations, info = _details(e)
    assert info.reason == "E720" and "no-such-model" in e.details()
    # a deployment that does not satisfy its contract: fraud-scorer needs TPM, memory encryption, a firewall
    e = _refused(stub.RegisterInstance, pb.RegisterInstanceRequest(id="x-2", model="fraud-scorer", deployment=dep))
    assert e.code() is grpc.StatusCode.FAILED_PRECONDITION
    violations, info = _details(e)
    assert info.reason == "E721" and {v.field for v in violations} == {"deployment"}
    assert any("tpm" in v.description for v in violations)
    # a field the registration itself gets wrong
    e = _refused(stub.RegisterInstance, pb.RegisterInstanceRequest(id="x-3", model="fraud-scorer", deployment=dep, score=2.0))
    assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
    violations, info = _details(e)
    assert info.reason == "E723" and [v.field for v in violations] == ["score"]


def test_the_cli_prints_the_same_problem_as_the_api(stub, served, capsys) -> None:
    headers = {"X-SLO-Latency": "5 GB/s"}
    violations, info = _details(_refused(stub.Decide, pb.DecideRequest(headers=headers)))
    code = main(["decide", "--server", f"127.0.0.1:{served.server.port}", "--format", "json",
                 *[f"--header={k}={v}" for k, v in headers.items()]])
    assert code != 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    err = out["error"]
    assert err["reason"] == info.reason == "E703"
    assert [(v["field"], v["description"]) for v in err["violations"]] == [(v.field, v.description) for v in violations]
