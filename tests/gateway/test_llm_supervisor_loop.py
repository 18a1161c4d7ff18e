"""The gateway serves its stream supervisor from the decision server's event loop, beside the
picker (`llm_side.LlmSide`): no thread of its own, whose loop would hand the GIL back and forth
with the picker's on every message (measured slower: `SupervisorServer`'s docstring,
benchmarks/RESULTS.md). Here: starting the LLM side adds no thread, the supervisor answers
Envoy's ext_proc stream, and stopping it closes its port."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from gateway_rig import SMALL
from llm_rig import llm_bundle

from policyc.gateway.llm_side import LlmOptions, LlmSide
from policyc.gateway.picker import PickerConfig
from policyc.gateway.server import PickerServer
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ServeConfig


def test_the_supervisor_is_served_from_the_decision_server_s_loop(tmp_path: Path) -> None:
    thread = ServerThread(DecisionServer(llm_bundle(), ServeConfig(cluster=SMALL, start_refresher=False)))
    thread.start()
    try:
        picker = PickerServer(thread.server, PickerConfig())
        thread.call(picker.start())
        before = set(threading.enumerate())
        side = LlmSide(thread, picker, tmp_path, LlmOptions())
        routes = side.start()
        assert routes.supervisor is not None
        try:
            assert set(threading.enumerate()) == before, set(threading.enumerate()) - before
            req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key=":path", raw_value=b"/v1/models")])))
            with grpc.insecure_channel(routes.supervisor) as ch:
                grpc.channel_ready_future(ch).result(timeout=30)
                answers = list(ep_grpc.ExternalProcessorStub(ch).Process(iter([req]), timeout=30))
            # not an LLM request the picker read: the answer body is left to pass unsupervised
            assert len(answers) == 1 and answers[0].HasField("request_headers")
            assert answers[0].mode_override.response_body_mode == ProcessingMode.NONE
        finally:
            side.stop()
        with grpc.insecure_channel(routes.supervisor) as ch, pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(ch).result(timeout=1)
        thread.call(picker.stop())
    finally:
        thread.stop()
