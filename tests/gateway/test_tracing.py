"""Traces through a real `policyc gateway --otlp-endpoint` (real Envoy, real KServe model
server) into a real OTLP/gRPC receiver (the collector's TraceService, served here): one
trace from the client's traceparent through Envoy's spans and the picker's parse, match,
place and audit spans, in the right parentage, with the decision id on the picker's spans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from policyc.audit.query import AuditReader
from policyc.client import operator_channel
from policyc.compiler import bundle_io
from policyc.gateway.bootstrap import GatewaySpec, OTLP_CLUSTER, build_bootstrap
from policyc.gateway.tracing import DECISION_ATTRIBUTE, SERVICE_NAME, trace_context
from policyc.matcher.instance import Instance
from policyc.modelserver.client import OipClient, token_ids
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
from policyc.modelserver.model_files import write_model_files
from policyc.modelserver.tracing import SERVICE_NAME as MODEL_SERVICE
from policyc.modelserver.tracing import SPAN_NAME as MODEL_SPAN
from policyc.server import convert
from policyc.server.proto import pb_grpc

from gateway_rig import PRIMARY, free_port

POLICYC = [sys.executable, "-m", "policyc.cli.main"]
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Collector(ts_grpc.TraceServiceServicer):
    """The OpenTelemetry collector's OTLP/gRPC trace receiver: keeps every span it is sent,
    with its resource's service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def Export(self, request: ts.ExportTraceServiceRequest, context: Any) -> ts.ExportTraceServiceResponse:  # noqa: N802
        with self.lock:
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    self.spans.extend((service, s) for s in ss.spans)
        return ts.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[tuple[str, Any]]:
        with self.lock:
            return [(svc, s) for svc, s in self.spans if s.trace_id.hex() == trace_id]


@pytest.fixture()
def collector():  # type: ignore[no-untyped-def]
    c = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    ts_grpc.add_TraceServiceServicer_to_server(c, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield c, f"127.0.0.1:{port}"
    server.stop(grace=None)


def _complete(spans: list[tuple[str, Any]]) -> bool:
    """The picker's five spans and Envoy's request span with its ext_proc and router children are in."""
    ours = {s.name for svc, s in spans if svc == SERVICE_NAME}
    envoy = [s for svc, s in spans if svc == "policyc-gateway"]
    return {"policyc.pick", "parse", "match", "place", "audit"} <= ours and len(envoy) >= 3 and \
        any(s.parent_span_id.hex() == CLIENT_SPAN for s in envoy) and any(svc == MODEL_SERVICE for svc, _ in spans)


def _accounting(db: Path, decision_id: str) -> Any:
    """The call's `accounting` record, once the gateway's access log has brought it in."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if db.exists():
            with AuditReader.open(db) as reader:
                got = [e.record for e in reader.actions_for(decision_id) if e.record.kind == "accounting"]  # type: ignore[union-attr]
            if got:
                assert len(got) == 1, got
                return got[0]
        time.sleep(0.2)
    raise AssertionError(f"no accounting record for {decision_id} within 30 s")


def _attr(span: Any, key: str) -> str:
    return next((a.value.string_value for a in span.attributes if a.key == key), "")


def test_a_request_through_the_gateway_yields_one_trace(bundle, tmp_path: Path, collector,  # type: ignore[no-untyped-def]
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    c, otlp = collector
    path = tmp_path / "bundle.json"
    bundle_io.write(bundle, path)
    api, listen, admin, picker = free_port(), free_port(), free_port(), free_port()
    proc = subprocess.Popen(POLICYC + ["gateway", "--bundle", str(path), "--port", str(api), "--listen", f"127.0.0.1:{listen}",
                                       "--admin", f"127.0.0.1:{admin}", "--picker-port", str(picker),
                                       "--workdir", str(tmp_path / "gw"), "--state-dir", str(tmp_path / "state"),
                                       "--audit-log", str(tmp_path / "audit.db"), "--otlp-endpoint", otlp],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    files = write_model_files(bundle.contract(PRIMARY), tmp_path / "models")
    iid = "fraud-scorer@host-0002/gpu0"
    # the model server is pointed at the collector as any OpenTelemetry process is (modelserver/tracing.py)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://{otlp}")
    models = ModelPool([ServerSpec((InstanceSpec(iid, files.full),))], workdir=tmp_path / "servers").start(timeout=60)
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    try:
        with grpc.insecure_channel(f"127.0.0.1:{api}") as probe:
            grpc.channel_ready_future(probe).result(timeout=30)
        with operator_channel(f"127.0.0.1:{api}") as ch:
            d = next(s.to_deployment() for s in _slots() if s.host == "host-0002" and s.gpu == "gpu0")
            inst = Instance(id=iid, model=PRIMARY, deployment=d.model_copy(update={"endpoint": models.endpoint(iid)}))
            pb_grpc.DecisionsStub(ch).RegisterInstance(convert.register_request(inst, onnx_model=files.full.read_bytes()),
                                                       timeout=10)
        with OipClient(f"127.0.0.1:{listen}") as client:
            deadline, ready, last = time.monotonic() + 15, None, ""
            while ready is None and time.monotonic() < deadline:
                try:  # the pool file is rewritten and Envoy loads it within a few hundred ms (these: traces of their own)
                    ready = client.infer(PRIMARY, token_ids(16), timeout=5, metadata=(("x-model", PRIMARY), ("x-tenant", "acme-bank")))
                except grpc.RpcError as e:
                    last = f"{e.code()}: {e.details()}"
                    time.sleep(0.2)
            assert ready is not None, last
            answer = client.infer(PRIMARY, token_ids(16), timeout=10, metadata=(("x-model", PRIMARY), ("x-tenant", "acme-bank"),
                                                                                ("traceparent", traceparent)))
            assert answer.instance == iid and answer.decision_id
        # Envoy's batch and the picker's (BatchSpanProcessor) arrive within a few seconds
        deadline = time.monotonic() + 60  # generous: a loaded machine delays the exporters' threads
        while time.monotonic() < deadline and not _complete(c.of_trace(CLIENT_TRACE)):
            time.sleep(0.2)
        accounting = _accounting(tmp_path / "audit.db", answer.decision_id)
        # the untraced warm-up call's record: Envoy began a trace of its own, named there too
        untraced = _accounting(tmp_path / "audit.db", ready.decision_id)
    finally:
        proc.terminate()  # the gateway alone: it stops Envoy and closes its audit log (its writer is in its group)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
        models.stop()
    assert proc.returncode == 0, err[-3000:]
    # the decision's call record names its trace; the trace's spans name the decision
    assert accounting.trace_id == CLIENT_TRACE, accounting
    assert untraced.trace_id is not None and untraced.trace_id != CLIENT_TRACE and c.of_trace(untraced.trace_id)
    spans = c.of_trace(CLIENT_TRACE)
    envoy = {s.span_id.hex(): s for svc, s in spans if svc == "policyc-gateway"}
    ours = [s for svc, s in spans if svc == SERVICE_NAME and _attr(s, DECISION_ATTRIBUTE) == answer.decision_id]
    assert envoy, f"no span of Envoy's in the client's trace; got {[(svc, s.name) for svc, s in c.spans]}"
    shape = [(s.name, s.span_id.hex(), s.parent_span_id.hex()) for s in envoy.values()]
    # one request: one span of Envoy's for it (its ingress), continuing the client's, and its children
    ingress = [s for s in envoy.values() if s.parent_span_id.hex() == CLIENT_SPAN]
    assert len(ingress) == 1, shape
    assert all(s is ingress[0] or s.parent_span_id == ingress[0].span_id for s in envoy.values()), shape
    by_name = {s.name: s for s in ours}
    assert set(by_name) == {"policyc.pick", "parse", "match", "place", "audit"}, \
        (sorted(by_name), answer.decision_id, [(svc, s.name, _attr(s, DECISION_ATTRIBUTE)) for svc, s in spans], err[-2000:])
    assert len(ours) == 5
    pick = by_name["policyc.pick"]
    # the pick is a child of Envoy's span for its ext_proc call, itself a child of the request's span
    ext_proc = envoy.get(pick.parent_span_id.hex())
    assert ext_proc is not None and "ExternalProcessor" in ext_proc.name, (pick.parent_span_id.hex(), shape)
    # the model server's inference span is a child of Envoy's router span (the upstream request carried its context)
    model = [s for svc, s in spans if svc == MODEL_SERVICE]
    assert len(model) == 1, [(s.name, s.parent_span_id.hex()) for s in model]
    router = envoy.get(model[0].parent_span_id.hex())
    assert router is not None and router.name.startswith("router "), (model[0].parent_span_id.hex(), shape)
    assert model[0].name == MODEL_SPAN and _attr(model[0], DECISION_ATTRIBUTE) == answer.decision_id
    for stage in ("parse", "match", "place", "audit"):
        s = by_name[stage]
        assert s.parent_span_id == pick.span_id, stage
        assert pick.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= pick.end_time_unix_nano, stage
    # the stages follow one another
    assert by_name["parse"].end_time_unix_nano <= by_name["match"].start_time_unix_nano + 1
    assert by_name["match"].end_time_unix_nano <= by_name["place"].start_time_unix_nano + 1
    assert by_name["place"].end_time_unix_nano <= by_name["audit"].start_time_unix_nano + 1


def test_the_bootstrap_traces_only_when_asked() -> None:
    plain = build_bootstrap(GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:8001",)))
    hcm = plain["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert "tracing" not in hcm
    assert all(c["name"] != OTLP_CLUSTER for c in plain["static_resources"]["clusters"])
    traced = build_bootstrap(GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:8001",), otlp_endpoint="127.0.0.1:4317"))
    hcm = traced["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["tracing"]["provider"]["name"] == "envoy.tracers.opentelemetry"
    otlp = next(c for c in traced["static_resources"]["clusters"] if c["name"] == OTLP_CLUSTER)
    assert otlp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == \
        {"socket_address": {"address": "127.0.0.1", "port_value": 4317}}


def test_trace_context_prefers_envoys_metadata_over_the_clients_header() -> None:
    from envoy.config.core.v3 import base_pb2

    headers = [base_pb2.HeaderValue(key="traceparent", raw_value=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01".encode())]
    envoys = f"00-{CLIENT_TRACE}-1111111111111111-01"
    assert trace_context((("traceparent", envoys),), headers) == (envoys, "")
    assert trace_context((), headers) == (f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "")
    assert trace_context(None, ()) == ("", "")


def test_a_bad_otlp_endpoint_is_a_one_line_error(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bundle.json"
    bundle_io.write(bundle, path)
    out = subprocess.run(POLICYC + ["gateway", "--bundle", str(path), "--port", "0", "--otlp-endpoint", "collector:4317"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "--otlp-endpoint collector:4317" in out.stderr, out.stderr


def _slots():  # type: ignore[no-untyped-def]
    from policyc.placer import SimulatedCluster
    from policyc.server.config import ClusterSpec

    c = ClusterSpec()
    return SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack).gpu_slots()


def test_a_calls_record_names_its_trace_and_old_records_keep_their_bytes() -> None:
    from pydantic import ValidationError

    from policyc.audit.accounting import call_accounting, call_accounting_body
    from policyc.gateway.access_log import _trace_id

    parts = dict(network_bytes=1234.0, network_method="envoy", compute_seconds=0.002, compute_method="x-policyc-compute-us",
                 target="127.0.0.1:8001", detail="{}")
    traced = call_accounting_body("d-1", 1.7e9, trace_id=CLIENT_TRACE, **parts)  # type: ignore[arg-type]
    assert traced == call_accounting("d-1", 1.7e9, trace_id=CLIENT_TRACE,  # type: ignore[arg-type]
                                     **parts).model_dump_json(exclude_none=True).encode()
    assert json.loads(traced)["trace_id"] == CLIENT_TRACE
    plain = call_accounting_body("d-1", 1.7e9, **parts)  # type: ignore[arg-type]
    assert b"trace_id" not in plain  # an untraced call's body, so its hash, as before tracing existed
    with pytest.raises(ValidationError):
        call_accounting("d-1", 1.7e9, trace_id="not-a-trace-id", **parts)  # type: ignore[arg-type]
    assert _trace_id(f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01") == CLIENT_TRACE
    for bad in (None, "", "00-xyz", f"00-{'0' * 32}-{CLIENT_SPAN}-01", f"00-{CLIENT_TRACE.upper()}-{CLIENT_SPAN}-01"):
        assert _trace_id(bad) is None, bad
