"""The picker's spans as OTLP bytes (`gateway/otlp_bytes.py`) and their export
(`gateway/tracing.py`): what is written decodes with the published `opentelemetry-proto`
classes into the five spans in their parentage; a real OTLP/gRPC TraceService receives
them; sampling is the parent's; a collector away or a full queue costs spans, never an
exception. (The whole path through Envoy and a model server: tests/gateway/test_tracing.py.)"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc
import pytest

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from policyc.gateway import otlp_bytes, tracing
from policyc.gateway.tracing import DECISION_ATTRIBUTE, SERVICE_NAME, PickerTracer, Stamps, sampled
from policyc.server.decision import Timing

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def _stamps(flags: str = "01", decision_id: str = "d-1", timing: Timing | None = None, state: str = "") -> Stamps:
    t = time.perf_counter()
    return Stamps(start=t, parsed=t + 10e-6, decided=t + 60e-6, end=t + 70e-6, traceparent=f"00-{TRACE}-{PARENT}-{flags}",
                  tracestate=state, decision_id=decision_id,
                  timing=timing if timing is not None else Timing(feasibility=2e-6, match=15e-6, place=20e-6))


def _spans(bodies: list[bytes]) -> list[tuple[str, Any]]:
    out = []
    for b in bodies:
        req = ts.ExportTraceServiceRequest.FromString(b)
        for rs in req.resource_spans:
            service = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
            for ss in rs.scope_spans:
                out += [(service, s) for s in ss.spans]
    return out


def test_a_picks_spans_decode_in_their_parentage() -> None:
    sent: list[bytes] = []
    tracer = PickerTracer("127.0.0.1:1", send=sent.append)
    st = _stamps(state="vendor=abc")
    tracer.record(st)
    tracer.shutdown()
    spans = _spans(sent)
    assert {svc for svc, _ in spans} == {SERVICE_NAME}
    by_name = {s.name: s for _, s in spans}
    assert sorted(by_name) == ["audit", "match", "parse", "place", "policyc.pick"] and len(spans) == 5
    pick = by_name["policyc.pick"]
    assert pick.trace_id.hex() == TRACE and pick.parent_span_id.hex() == PARENT and pick.trace_state == "vendor=abc"
    assert pick.kind == pick.SPAN_KIND_SERVER
    offset = tracer._offset_ns
    assert pick.start_time_unix_nano == offset + int(st.start * 1e9) and pick.end_time_unix_nano == offset + int(st.end * 1e9)
    ids = {s.span_id for _, s in spans}
    assert len(ids) == 5 and all(len(i) == 8 and i != b"\0" * 8 for i in ids)
    for stage in ("parse", "match", "place", "audit"):
        s = by_name[stage]
        assert s.trace_id == pick.trace_id and s.parent_span_id == pick.span_id and s.kind == s.SPAN_KIND_INTERNAL
        assert pick.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= pick.end_time_unix_nano
        assert [(a.key, a.value.string_value) for a in s.attributes] == [(DECISION_ATTRIBUTE, "d-1")]
    assert by_name["parse"].end_time_unix_nano == by_name["match"].start_time_unix_nano
    assert by_name["place"].end_time_unix_nano == by_name["audit"].start_time_unix_nano
    # the match span lasts the decision's feasibility + match time (to the nanosecond's rounding)
    m = by_name["match"]
    assert abs((m.end_time_unix_nano - m.start_time_unix_nano) - 17_000) <= 2
    assert tracer.exported == 1 and tracer.spans == 1
    assert tracer.cpu_s > 0  # the CPU its writing and sending took, measured on the thread that did it


def test_a_refusal_before_any_decision_is_one_span_with_its_parse() -> None:
    sent: list[bytes] = []
    tracer = PickerTracer("127.0.0.1:1", send=sent.append)
    st = _stamps(decision_id="")
    st.timing = None
    tracer.record(st)
    tracer.shutdown()
    spans = [s for _, s in _spans(sent)]
    assert sorted(s.name for s in spans) == ["parse", "policyc.pick"] and all(not s.attributes for s in spans)


@pytest.mark.parametrize("traceparent", ["", f"00-{TRACE}-{PARENT}-00", f"00-{TRACE}-{PARENT}-02", "garbage"])
def test_without_a_sampled_parent_nothing_is_queued(traceparent: str) -> None:
    sent: list[bytes] = []
    tracer = PickerTracer("127.0.0.1:1", send=sent.append)
    st = _stamps()
    st.traceparent = traceparent
    tracer.record(st)
    assert tracer.spans == 0 and not tracer._queue
    tracer.shutdown()
    assert sent == []


@pytest.mark.parametrize("bad", [f"00-{'0' * 32}-{PARENT}-01", f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE.upper()}-{PARENT}-01",
                                 f"ff-{TRACE}-{PARENT}-01", f"00-{TRACE}-{PARENT}-01-extra", f"00-{TRACE}-{PARENT[:-1]}x-01"])
def test_a_malformed_sampled_traceparent_is_counted_not_sent(bad: str) -> None:
    assert otlp_bytes.parse_traceparent(bad) is None
    sent: list[bytes] = []
    tracer = PickerTracer("127.0.0.1:1", send=sent.append)
    st = _stamps()
    st.traceparent = bad
    tracer.record(st)
    tracer.shutdown()
    assert sent == [] and tracer.invalid == (1 if sampled(bad) else 0)


def test_a_later_version_is_read_as_version_00_prescribes() -> None:
    assert otlp_bytes.parse_traceparent(f"01-{TRACE}-{PARENT}-01-more") == (bytes.fromhex(TRACE), bytes.fromhex(PARENT))


class _Receiver(ts_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.lock = threading.Lock()

    def Export(self, request: ts.ExportTraceServiceRequest, context: Any) -> ts.ExportTraceServiceResponse:  # noqa: N802
        with self.lock:
            self.requests.append(request.SerializeToString())
        return ts.ExportTraceServiceResponse()


def test_a_real_trace_service_receives_the_batches() -> None:
    receiver = _Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ts_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        tracer = PickerTracer(f"127.0.0.1:{port}")
        for i in range(300):
            tracer.record(_stamps(decision_id=f"d-{i}"))
        deadline = time.monotonic() + 60  # the exporter's thread flushes every 0.2 s; generous for a loaded machine
        while time.monotonic() < deadline and tracer.exported < 300:
            time.sleep(0.05)
        tracer.shutdown()
    finally:
        server.stop(grace=None)
    spans = _spans(receiver.requests)
    assert tracer.exported == 300 and tracer.failed == 0
    assert len(spans) == 300 * 5
    picks = {s.attributes[0].value.string_value for _, s in spans if s.name == "policyc.pick"}
    assert picks == {f"d-{i}" for i in range(300)}


def test_a_collector_away_costs_spans_not_requests() -> None:
    with socket_port() as port:  # a port nothing listens on
        tracer = PickerTracer(f"127.0.0.1:{port}")
        tracer.record(_stamps())
        tracer.shutdown()
    assert tracer.failed >= 1 and tracer.exported == 0


def test_a_failed_export_is_tried_again_then_dropped_and_the_stop_waits_for_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "MAX_BATCH", 10)
    monkeypatch.setattr(tracing, "FLUSH_S", 60.0)
    calls: list[int] = []

    def away(body: bytes) -> None:  # as a collector whose calls time out: one call a flush, not one a batch
        calls.append(len(body))
        raise grpc.RpcError("deadline exceeded")

    tracer = PickerTracer("127.0.0.1:1", send=away)
    for _ in range(35):
        tracer.record(_stamps())
    tracer.flush()
    assert len(calls) == 1 and tracer.failed == 1 and tracer.dropped == 0 and len(tracer._queue) == 25  # held, tried again
    tracer.flush()
    tracer.flush()  # the third call for the first batch: its 10 picks dropped, the next batch waits for the next flush
    assert len(calls) == 3 and tracer.dropped == 10 and len(tracer._queue) == 25
    tracer.shutdown()  # the stop tries once more and drops what is left
    assert len(calls) == 4 and tracer.exported == 0 and tracer.dropped == 35 and not tracer._queue


def test_a_collector_that_fails_its_first_call_gets_every_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed Export is tried again on the next flush, whatever was queued behind it kept
    (a collector's first call can fail while its channel connects on a loaded machine)."""
    monkeypatch.setattr(tracing, "MAX_BATCH", 10)
    monkeypatch.setattr(tracing, "FLUSH_S", 60.0)
    sent: list[bytes] = []

    def first_fails(body: bytes) -> None:
        sent.append(body)
        if len(sent) == 1:
            raise grpc.RpcError("deadline exceeded")

    tracer = PickerTracer("127.0.0.1:1", send=first_fails)
    for _ in range(15):
        tracer.record(_stamps())
    tracer.flush()
    assert tracer.failed == 1 and tracer.exported == 0
    tracer.flush()
    assert tracer.exported == 15 and tracer.dropped == 0 and sent[1] == sent[0]  # the same request again, then the rest
    tracer.shutdown()


def test_a_full_queue_drops_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "MAX_QUEUED", 3)
    monkeypatch.setattr(tracing, "FLUSH_S", 60.0)
    sent: list[bytes] = []
    tracer = PickerTracer("127.0.0.1:1", send=sent.append)
    for _ in range(5):
        tracer.record(_stamps())
    assert tracer.spans == 3 and tracer.dropped == 2
    tracer.shutdown()
    assert tracer.exported == 3


class socket_port:  # noqa: N801 - a context manager named for what it gives
    """A loopback port bound and closed again: nothing listens there."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        return None


def test_envoy_samples_the_share_asked_and_exports_in_batches() -> None:
    from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap

    def tracing_of(**kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        b = build_bootstrap(GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:8001",), otlp_endpoint="127.0.0.1:4317", **kw))
        hcm = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        return hcm["tracing"], b["layered_runtime"]["layers"][0]["static_layer"]

    tr, runtime = tracing_of()
    assert tr["random_sampling"] == {"value": 100.0}
    assert runtime["tracing.opentelemetry.min_flush_spans"] > 5 and runtime["tracing.opentelemetry.flush_interval_ms"] <= 1000
    assert tracing_of(otlp_sampling=12.5)[0]["random_sampling"] == {"value": 12.5}
    for bad in (-1.0, 100.5, float("nan")):
        with pytest.raises(ValueError, match="otlp_sampling"):
            tracing_of(otlp_sampling=bad)
    plain = build_bootstrap(GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:8001",)))
    assert "layered_runtime" not in plain  # untraced gateways keep Envoy's defaults


def test_a_bad_sampling_share_is_a_one_line_error() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "policyc.cli.main", "gateway", "--print-bootstrap", "--endpoint", "127.0.0.1:8001",
                          "--otlp-endpoint", "127.0.0.1:4317", "--otlp-sampling", "150"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "--otlp-sampling 150" in out.stderr, out.stderr
