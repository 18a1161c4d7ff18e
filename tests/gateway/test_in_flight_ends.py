"""The picker counts a pick in flight on its GPU (placer/signals/gateway_in_flight.py) only
when it will learn the request's end: following Envoy's access log, a call Envoy logs (the
pick marked it, as it marks the breakable ones, or the log carries every call: an
accounting receiver); not following it, the ext_proc stream's end. A pick with no budget
under a log of marked calls only gets no entry, so a count begun for it would stand on its
GPU for `InFlightCounts.max_age_s` (60 s of traffic), never measured, skewing every later
pick. An LLM pick is still counted as before (the LLM placement's figures are measured so).
No Envoy here: the picker's pick is called as its gRPC handler calls it."""

from __future__ import annotations

from typing import Iterator

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from gateway_rig import BACKUP, PRIMARY, SMALL, pool_layout

from policyc.compiler.bundle import Bundle
from policyc.gateway.access_log import AccessLogReceiver
from policyc.gateway.picker import EndpointPicker, PickerConfig
from policyc.gateway.server import PickerServer
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import EnforcerMode, ServeConfig


@pytest.fixture(scope="module")
def decisions(bundle: Bundle) -> Iterator[ServerThread]:
    """A decision service with the rig's pool registered at made-up endpoints (nothing is sent there)."""
    server = DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE))
    thread = ServerThread(server)
    thread.start()
    slots = pool_layout(bundle, server, primaries=1, backups=1)
    server.engine.register_many([s.instance.model_copy(update={"deployment": s.instance.deployment.model_copy(
        update={"endpoint": f"127.0.0.1:{20000 + i}"})}) for i, s in enumerate(slots)])
    yield thread
    thread.stop()


def _headers(model: str) -> ep.ProcessingRequest:
    req = ep.ProcessingRequest()
    for k, v in ((":method", "POST"), (":path", "/inference.GRPCInferenceService/ModelInfer"), ("x-model", model),
                 ("x-data-region", "us-west"), ("x-tenant", "acme-bank"), ("x-request-id", "r-1")):
        req.request_headers.headers.headers.append(base_pb2.HeaderValue(key=k, raw_value=v.encode()))
    return req


def _pick(thread: ServerThread, picker: EndpointPicker, model: str, llm: bool = False) -> tuple[str, bool]:
    """One pick of `model` on the serving loop: its decision id, and whether it has a budget.
    `llm`: as the LLM picker asks it (with its body's typed attributes, here none)."""

    async def pick() -> tuple[str, bool]:
        _, p = await picker._request_headers(_headers(model), {} if llm else None)
        assert p is not None, f"{model} was not forwarded"
        return p.decision_id, p.per_try_timeout_ms is not None

    return thread.call(pick())


@pytest.mark.parametrize("every_call", [False, True])
def test_a_pick_counts_in_flight_only_when_its_access_log_entry_will_come(decisions: ServerThread, every_call: bool) -> None:
    picker = PickerServer(decisions.server, PickerConfig()).picker
    receiver = AccessLogReceiver(None, every_attempt=False, body_sink=(lambda body: None) if every_call else None)
    assert receiver.records is every_call
    picker.follow_access_log(receiver)
    counts = picker.in_flight_gpus
    assert counts is not None
    plain, plain_breaks = _pick(decisions, picker, BACKUP)  # no budget: marked for no log entry
    timed, timed_breaks = _pick(decisions, picker, PRIMARY)  # a budget: marked, its entry comes
    assert (plain_breaks, timed_breaks) == (False, True)
    assert counts.end(timed) is not None  # counted, ended once
    # counted only when Envoy logs every call; under a log of marked calls only, never begun
    assert (counts.end(plain) is not None) is every_call
    assert not counts.busy()
    # an LLM pick is counted as before, whatever the log carries
    llm, _ = _pick(decisions, picker, BACKUP, llm=True)
    assert counts.end(llm) is not None


def test_not_following_the_access_log_every_pick_counts_until_its_stream_ends(decisions: ServerThread) -> None:
    picker = PickerServer(decisions.server, PickerConfig()).picker
    counts = picker.in_flight_gpus
    assert counts is not None
    plain, _ = _pick(decisions, picker, BACKUP)
    assert counts.end(plain) is not None  # `Process` ends it with the stream (`finally`)
