"""The stream supervisor serves on an event loop of its own thread (`ServerThread`, as
`policyc gateway` runs it): every body chunk of every supervised answer is a message there, and on
the decision server's loop the picker's picks queued behind them (benchmarks/RESULTS.md, real vLLM).
Here: it answers Envoy's ext_proc stream from that thread, and stopping it ends the thread."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from policyc.gateway.llm_stream import StreamSupervisor, SupervisorServer
from policyc.server.app import ServerThread


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_supervisor_answers_from_its_own_thread_and_stops() -> None:
    sup = StreamSupervisor(SimpleNamespace(recent={}), lambda: SimpleNamespace(contract=lambda _: None))  # type: ignore[arg-type]
    server = ServerThread(SupervisorServer(sup), name="policyc-llm-supervisor")
    before = len(_threads("policyc-llm-supervisor"))
    port = server.start()
    try:
        mine = _threads("policyc-llm-supervisor")
        assert len(mine) == before + 1 and all(t is not threading.current_thread() for t in mine)
        req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":path", raw_value=b"/v1/models")])))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=30)
            answers = list(ep_grpc.ExternalProcessorStub(ch).Process(iter([req]), timeout=30))
        # not an LLM request the picker read: the answer body is left to pass unsupervised
        assert len(answers) == 1 and answers[0].HasField("request_headers")
        assert answers[0].mode_override.response_body_mode == ProcessingMode.NONE
    finally:
        server.stop()
    assert len(_threads("policyc-llm-supervisor")) == before
