"""The stream supervisor's accounting record survives Envoy's reset of its gRPC stream.

Once Envoy has an attempt's last message back from the supervisor it finishes the attempt
and resets the ext_proc stream; the reset cancels the handler, and it may do so while the
write of that last message (already sent) is still awaiting. The record used to be written
after that write, so about one stream in twenty on a loaded machine had none (the demo's
retried stream, `test_audit_tokens_equal_the_servers_usage`). Here the reset is made to land
exactly there, every time: the context's write of the last body raises CancelledError, as
grpc.aio does to a cancelled handler."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from policyc.gateway.bootstrap import DECISION_HEADER
from policyc.gateway.llm_body import LlmRequest
from policyc.gateway.llm_stream import StreamSupervisor
from policyc.gateway.tokens import TokenCount

DID = "d" * 32
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'


class ResetOnLastWrite:
    """An ext_proc stream whose peer resets it when the answer's last body goes back."""

    def __init__(self, messages: list[ep.ProcessingRequest]) -> None:
        self.messages = messages
        self.written: list[ep.ProcessingResponse] = []

    async def read(self) -> ep.ProcessingRequest:
        await asyncio.sleep(0)
        return self.messages.pop(0)

    async def write(self, r: ep.ProcessingResponse) -> None:
        self.written.append(r)
        await asyncio.sleep(0)
        if r.response_body.response.body_mutation.streamed_response.end_of_stream:
            raise asyncio.CancelledError  # sent; the peer's reset cancels the handler before the write returns


def _messages(stream: bool) -> list[ep.ProcessingRequest]:
    first = ep.ProcessingRequest()
    first.request_headers.headers.headers.add(key=DECISION_HEADER, raw_value=DID.encode())
    headers = ep.ProcessingRequest()
    headers.response_headers.headers.headers.add(key=":status", raw_value=b"200")
    chunks = [b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"text":"b"}]}\n\n', USAGE + b"data: [DONE]\n\n"] \
        if stream else [b'{"choices":[{"text":"ab"}],', b'"usage":{"prompt_tokens":5,"completion_tokens":2}}']
    out = [first, headers]
    for i, c in enumerate(chunks):
        m = ep.ProcessingRequest()
        m.response_body.body = c
        m.response_body.end_of_stream = i == len(chunks) - 1
        out.append(m)
    return out


@pytest.mark.parametrize("stream", [True, False])
def test_the_record_is_kept_when_the_reset_lands_on_the_last_write(stream: bool) -> None:
    req = LlmRequest("completions", "m", TokenCount(5, True, "test"), 2, stream, None, True, {})
    submitted: list[Any] = []
    sink = SimpleNamespace(submit_action=submitted.append)
    sup = StreamSupervisor(SimpleNamespace(recent={DID: req}), lambda: SimpleNamespace(contract=lambda _: None),  # type: ignore[arg-type]
                           sink)  # type: ignore[arg-type]
    ctx = ResetOnLastWrite(_messages(stream))

    async def run() -> None:
        await sup.Process(iter(()), ctx)  # type: ignore[arg-type]

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run())
    assert ctx.written[-1].response_body.response.body_mutation.streamed_response.end_of_stream  # the answer went out
    records = [r for r in submitted if r.kind == "accounting"]
    assert len(records) == 1 and records[0].decision_id == DID, [r.kind for r in submitted]
    llm = records[0].llm
    assert llm.prompt_tokens.value == 5 and llm.completion_tokens.value == 2  # the answer's usage: it was whole
    assert "cut" not in records[0].detail


def test_an_attempt_reset_mid_answer_is_recorded_as_cut() -> None:
    """The client left after the first token: the attempt answered part, and its record says so."""
    req = LlmRequest("completions", "m", TokenCount(5, True, "test"), 2, True, None, True, {})
    submitted: list[Any] = []
    sup = StreamSupervisor(SimpleNamespace(recent={DID: req}), lambda: SimpleNamespace(contract=lambda _: None),  # type: ignore[arg-type]
                           SimpleNamespace(submit_action=submitted.append))  # type: ignore[arg-type]
    messages = _messages(True)[:3]  # headers, then one token; then the reset

    class Ctx(ResetOnLastWrite):
        async def read(self) -> ep.ProcessingRequest:
            if not self.messages:
                raise asyncio.CancelledError
            return await super().read()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(sup.Process(iter(()), Ctx(messages)))  # type: ignore[arg-type]
    records = [r for r in submitted if r.kind == "accounting"]
    assert len(records) == 1 and "cut" in records[0].detail, [r.detail for r in submitted]
    assert records[0].llm.completion_tokens.value == 1  # the one token it sent, counted from the events
    assert sup.counts.get("reset") == 1


def test_an_attempt_reset_before_its_first_token_has_no_record() -> None:
    """The TTFT break: Envoy resets the attempt while its headers are held; nothing was answered."""
    req = LlmRequest("completions", "m", TokenCount(5, True, "test"), 2, True, None, True, {})
    submitted: list[Any] = []
    sup = StreamSupervisor(SimpleNamespace(recent={DID: req}), lambda: SimpleNamespace(contract=lambda _: None),  # type: ignore[arg-type]
                           SimpleNamespace(submit_action=submitted.append))  # type: ignore[arg-type]

    class Ctx(ResetOnLastWrite):
        async def read(self) -> ep.ProcessingRequest:
            if not self.messages:
                raise asyncio.CancelledError
            return await super().read()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(sup.Process(iter(()), Ctx(_messages(True)[:2])))  # type: ignore[arg-type]
    assert not submitted and sup.counts.get("reset") == 1
