"""The decision service as operators and their tools see it: readiness apart from liveness
in gRPC health, roles checked by the server interceptor, `policyc.client`'s errors, and the
Prometheus series (per-RPC counts and latency, the decision total apart from its stages,
the enforcer's series) on their own address."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from policy_text import REPO

from policyc.client import operator_channel
from policyc.client import ClientError, DecisionClient, Unavailable
from policyc.compiler.pipeline import compile_paths
from policyc.server import convert
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.auth import METHOD_PERMISSIONS, Tokens
from policyc.server.config import ClusterSpec, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import SERVICE_NAME, pb

SMALL = ClusterSpec(seed=1, hosts=8, gpus_per_host=4)
FINANCE = {"X-Data-Region": "us-west", "X-Tenant": "acme-bank"}


@pytest.fixture(scope="module")
def bundle():  # type: ignore[no-untyped-def]
    b = compile_paths([REPO / "policies"]).bundle
    assert b is not None
    return b


def _status(port: int, service: str) -> str:
    with operator_channel(f"127.0.0.1:{port}") as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


def _eventually(fn, want: str, within: float = 5.0) -> str:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    got = fn()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = fn()
    return got


def _fraud_instance(server: DecisionServer, i: int = 0):  # type: ignore[no-untyped-def]
    assert server.cluster is not None
    return [x for x in admissible_fleet(server.state.bundle, server.cluster.gpu_slots()) if x.model == "fraud-scorer"][i]


def test_not_ready_until_the_registry_is_warm_and_again_when_the_topology_goes_stale(bundle) -> None:  # type: ignore[no-untyped-def]
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, refresh_interval=0.05, ready_min_instances=1)))
    port = th.start()
    try:
        assert _status(port, "liveness") == "SERVING"
        for name in ("", "readiness", SERVICE_NAME):
            assert _status(port, name) == "NOT_SERVING", name
        assert th.server.readiness.reasons == ["registry: 0 of 1 instances registered"]
        with DecisionClient(f"127.0.0.1:{port}", token=th.server.operator_token) as c:
            c.register_message(convert.register_request(_fraud_instance(th.server)))
            assert _eventually(lambda: c.health("readiness"), "SERVING") == "SERVING"
            assert c.health("") == "SERVING" and c.health(SERVICE_NAME) == "SERVING"
            th.server.refresher.stop()  # a stalled telemetry refresher: placements would read an old topology
            assert _eventually(lambda: c.health("readiness"), "NOT_SERVING", within=6.0) == "NOT_SERVING"
            assert c.health("liveness") == "SERVING"
            assert th.server.readiness.reasons[0].startswith("topology: snapshot is ")
    finally:
        th.stop()


@pytest.fixture(scope="module")
def secured(bundle):  # type: ignore[no-untyped-def]
    tokens = Tokens.parse(["client:c-tok", "auditor:a-tok", "operator:o-tok"])
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, tokens=tokens, start_refresher=False)))
    port = th.start()
    yield th, f"127.0.0.1:{port}"
    th.stop()


def test_every_method_of_the_service_has_a_permission() -> None:
    methods = {f"/{SERVICE_NAME}/{m.name}" for m in pb.DESCRIPTOR.services_by_name["Decisions"].methods}
    assert methods == set(METHOD_PERMISSIONS)


def test_roles_are_checked_before_the_method_runs(secured) -> None:  # type: ignore[no-untyped-def]
    th, addr = secured
    inst = _fraud_instance(th.server)
    with DecisionClient(addr, token="o-tok") as op:
        assert op.register_message(convert.register_request(inst)).registry_size == 1
    with DecisionClient(addr, token="c-tok") as client:
        assert client.decide(FINANCE).outcome == pb.ADMITTED
        with pytest.raises(ClientError) as e:
            client.list_instances()
        assert e.value.code is grpc.StatusCode.PERMISSION_DENIED and "role `client` may not list" in e.value.message
        with pytest.raises(ClientError) as e:
            client.deregister(inst.id)
        assert e.value.code is grpc.StatusCode.PERMISSION_DENIED
    with DecisionClient(addr, token="a-tok") as auditor:
        assert [i.id for i in auditor.list_instances().instances] == [inst.id]
        with pytest.raises(ClientError) as e:
            auditor.decide(FINANCE)
        assert e.value.code is grpc.StatusCode.PERMISSION_DENIED
    with DecisionClient(addr) as anonymous:
        assert anonymous.health("liveness") == "SERVING"  # probes carry no token
        with pytest.raises(ClientError) as e:
            anonymous.decide(FINANCE)
        assert e.value.code is grpc.StatusCode.UNAUTHENTICATED
    with DecisionClient(addr, token="wrong") as stranger:
        with pytest.raises(ClientError) as e:
            stranger.decide(FINANCE)
        assert e.value.code is grpc.StatusCode.UNAUTHENTICATED and e.value.message == "unknown token"
    text = th.server.metrics.text().decode()
    assert 'policyc_rpc_errors_total{method="ListInstances",status="PERMISSION_DENIED"} 1.0' in text
    assert 'policyc_rpc_errors_total{method="Decide",status="UNAUTHENTICATED"} 2.0' in text


def test_client_reads_error_details_and_tells_down_from_refused(bundle) -> None:  # type: ignore[no-untyped-def]
    with ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, start_refresher=False))) as th:
        addr = f"127.0.0.1:{th.server.port}"
        with DecisionClient(addr, token=th.server.operator_token) as c:
            bad = convert.register_request(_fraud_instance(th.server))
            bad.deployment.tpm = False
            bad.deployment.region = "eu-west"
            with pytest.raises(ClientError) as e:
                c.register_message(bad)
            err = e.value
            assert err.code is grpc.StatusCode.FAILED_PRECONDITION and not isinstance(err, Unavailable)
            assert any("tpm" in p for p in err.problems) and any("region" in p for p in err.problems), err.problems
            # the google.rpc.Status details (grpc_status.rpc_status.from_call): ErrorInfo and BadRequest
            assert err.domain == "policyc" and err.reason.startswith("E7"), (err.domain, err.reason)
            assert err.violations and all(v.field == "deployment" for v in err.violations)
            with pytest.raises(ClientError) as e:
                c.decide({"X-SLO-Latency": "fast"})
            assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert [v.field for v in e.value.violations] == ["X-SLO-Latency"] and "not a time" in e.value.violations[0].description
            with pytest.raises(ClientError) as e:
                c.decide({"X-Tenant": "acme-bnak"})
            assert e.value.code is grpc.StatusCode.NOT_FOUND and "unknown tenant" in e.value.message
            assert e.value.as_json()["code"] == "NOT_FOUND"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with DecisionClient(f"127.0.0.1:{closed}", timeout=1.0) as c:
        with pytest.raises(Unavailable):
            c.decide(FINANCE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_on_their_own_address_per_rpc_and_totals_apart(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = _free_port()
    cfg = ServeConfig(cluster=SMALL, start_refresher=False, metrics_port=port, metrics_host="127.0.0.1")
    with ServerThread(DecisionServer(bundle, cfg)) as th:
        with DecisionClient(f"127.0.0.1:{th.server.port}", token=th.server.operator_token) as c:
            c.register_message(convert.register_request(_fraud_instance(th.server)))
            for _ in range(5):
                assert c.decide(FINANCE).outcome == pb.ADMITTED
            with pytest.raises(ClientError):
                c.decide({"X-Tenant": "acme-bnak"})
            c.list_instances()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'policyc_rpc_requests_total{code="OK",method="Decide"} 5.0' in text
    assert 'policyc_rpc_requests_total{code="NOT_FOUND",method="Decide"} 1.0' in text
    assert 'policyc_rpc_requests_total{code="OK",method="RegisterInstance"} 1.0' in text
    assert 'policyc_rpc_seconds_count{method="Decide"} 6.0' in text
    assert "policyc_decision_seconds_count 5.0" in text
    assert 'stage="total"' not in text  # a sum over `stage` counts each decision once
    assert 'policyc_decision_stage_seconds_count{stage="match"} 5.0' in text
    assert "policyc_enforcer_active_streams 0.0" in text and "policyc_enforcer_quarantines_total 0.0" in text
    assert "policyc_enforcer_programs_attached 0.0" in text  # the user-space plane attaches none
