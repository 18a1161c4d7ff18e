"""The picker's ext_proc stream as a gRPC client sees it, message by message: the method is
registered as unary-request (grpc hands the handler the stream's first message), so the
messages after the first must still be read and answered in order, and the stream must end
where the Endpoint Picker Protocol ends it. No Envoy here: a client that sends what Envoy
would never send first (a body before the headers) and what it sends in the response phase."""

from __future__ import annotations

import asyncio
from typing import Iterator

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from gateway_rig import PRIMARY, SMALL

from policyc.compiler.bundle import Bundle
from policyc.gateway.access_log import AccessLogReceiver
from policyc.gateway.picker import PickerConfig
from policyc.gateway.server import EXT_PROC_SERVICE, PickerServer
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import EnforcerMode, ServeConfig

PATH = f"/{EXT_PROC_SERVICE}/Process"


@pytest.fixture(scope="module")
def decisions(bundle: Bundle) -> Iterator[ServerThread]:
    """A decision service with no instance registered: every pick is refused (an immediate
    response), which is all these stream-shape checks need."""
    thread = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE)))
    thread.start()
    yield thread
    thread.stop()


def _headers() -> ep.ProcessingRequest:
    req = ep.ProcessingRequest()
    for k, v in ((":method", "POST"), (":path", "/inference.GRPCInferenceService/ModelInfer"), ("x-model", PRIMARY),
                 ("x-data-region", "us-west"), ("x-tenant", "acme-bank")):
        req.request_headers.headers.headers.append(base_pb2.HeaderValue(key=k, raw_value=v.encode()))
    return req


def _exchange(port: int, messages: list[ep.ProcessingRequest]) -> tuple[list[ep.ProcessingResponse], grpc.StatusCode]:
    """Send each message and read its answer before the next; then half-close and read to the end."""

    async def run() -> tuple[list[ep.ProcessingResponse], grpc.StatusCode]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.stream_stream(PATH, request_serializer=ep.ProcessingRequest.SerializeToString,
                                    response_deserializer=ep.ProcessingResponse.FromString)(timeout=30)
            got: list[ep.ProcessingResponse] = []
            for m in messages:
                await call.write(m)
                answer = await call.read()
                assert answer is not grpc.aio.EOF, f"the stream ended after {len(got)} answer(s)"
                got.append(answer)
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            return got, await call.code()

    return asyncio.run(run())


def _picker(decisions: ServerThread, follow_log: bool) -> tuple[PickerServer, int]:
    picker = PickerServer(decisions.server, PickerConfig())
    if follow_log:
        picker.picker.follow_access_log(AccessLogReceiver(None, every_attempt=False))
    return picker, decisions.call(picker.start())


def test_following_the_access_log_messages_before_the_headers_are_answered_and_the_pick_ends_the_stream(
        decisions: ServerThread) -> None:
    picker, port = _picker(decisions, follow_log=True)
    try:
        body = ep.ProcessingRequest()
        body.request_body.body = b"x"
        answers, code = _exchange(port, [body, _headers()])
        assert answers[0].HasField("request_body")  # the first message, handed over by grpc, answered in kind
        assert answers[1].HasField("immediate_response")  # the pick (refused: no instance), then the stream ends
        assert answers[1].immediate_response.details
        assert code == grpc.StatusCode.OK
    finally:
        decisions.call(picker.stop(grace=0.1))


def test_in_the_response_phase_every_later_message_is_read_and_answered(decisions: ServerThread) -> None:
    picker, port = _picker(decisions, follow_log=False)
    try:
        answer_phase = ep.ProcessingRequest()
        answer_phase.response_headers.headers.headers.append(base_pb2.HeaderValue(key=":status", raw_value=b"200"))
        answers, code = _exchange(port, [_headers(), answer_phase])
        assert answers[0].HasField("immediate_response")
        assert answers[1].HasField("response_headers")  # read after the first (grpc's) message, answered
        assert code == grpc.StatusCode.OK
        assert picker.picker.in_flight == 0
    finally:
        decisions.call(picker.stop(grace=0.1))


def test_headers_only_the_pick_is_the_one_answer_and_the_stream_ends_with_it(decisions: ServerThread) -> None:
    """`PickerConfig.headers_only` (policyc gateway's own Envoy, following its access log):
    the method is unary-unary, so the headers' answer is the stream's one message and its
    status follows in the same batch; a message other than headers (which that Envoy never
    sends) is answered in kind and ends the stream too."""
    picker = PickerServer(decisions.server, PickerConfig(headers_only=True))
    picker.picker.follow_access_log(AccessLogReceiver(None, every_attempt=False))
    port = decisions.call(picker.start())

    async def one(first: ep.ProcessingRequest) -> tuple[ep.ProcessingResponse, object, grpc.StatusCode]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.stream_stream(PATH, request_serializer=ep.ProcessingRequest.SerializeToString,
                                    response_deserializer=ep.ProcessingResponse.FromString)(timeout=30)
            await call.write(first)
            answer = await call.read()
            return answer, await call.read(), await call.code()

    try:
        answer, end, code = asyncio.run(one(_headers()))
        assert answer.HasField("immediate_response") and answer.immediate_response.details  # refused: no instance
        assert end is grpc.aio.EOF and code == grpc.StatusCode.OK
        body = ep.ProcessingRequest()
        body.request_body.body = b"x"
        answer, end, code = asyncio.run(one(body))
        assert answer.HasField("request_body") and end is grpc.aio.EOF and code == grpc.StatusCode.OK
    finally:
        decisions.call(picker.stop(grace=0.1))
