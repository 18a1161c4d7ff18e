"""The service's event loop: uvloop by default, asyncio on request, a clear error otherwise;
the server thread serves on it."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from server_rig import SMALL, start

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.server.config import ServeConfig
from policyc.server.event_loop import ENV, LoopKind, loop_kind, new_event_loop, run
from policyc.server.proto import pb, pb_grpc


def test_uvloop_by_default_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert loop_kind() is LoopKind.UVLOOP
    loop = new_event_loop()
    assert isinstance(loop, uvloop.Loop)
    loop.close()
    monkeypatch.setenv(ENV, "asyncio")
    loop = new_event_loop()
    assert not isinstance(loop, uvloop.Loop) and isinstance(loop, asyncio.AbstractEventLoop)
    loop.close()


def test_unknown_loop_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "tornado")
    with pytest.raises(ValueError, match="POLICYC_EVENT_LOOP='tornado': expected one of uvloop, asyncio"):
        new_event_loop()


def test_run_returns_the_coroutines_result_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(which()).startswith("uvloop")


def test_server_thread_decides_on_uvloop(bundle: Bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        assert isinstance(th.loop, uvloop.Loop)
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            d = pb_grpc.DecisionsStub(ch).Decide(pb.DecideRequest(headers={"X-Model": "fraud-scorer-lite"}))
        assert d.outcome == pb.ADMITTED and d.placement.instance_id
    finally:
        th.stop()
