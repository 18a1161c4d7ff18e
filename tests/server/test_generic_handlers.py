"""The decision server adds every service as a generic handler and registers no method
(grpc.aio waits on one pending request-call per registered method after every call, on
the serving loop): Decide, DecideBatch, health (unary and streaming) and reflection all
answer, and the server's loop waits on one request-call, not one per method."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.server.config import ServeConfig
from policyc.server.proto import SERVICE_NAME, pb, pb_grpc
from server_rig import SMALL, start


def test_no_method_is_registered_and_every_service_answers(bundle: Bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[str] = []
    waited: list[int] = []  # how many request-calls the server's loop waits on, each time it waits
    real_server, real_wait = grpc.aio.server, asyncio.wait

    def spy_server(*args, **kwargs):  # type: ignore[no-untyped-def]
        s = real_server(*args, **kwargs)
        add = s.add_registered_method_handlers
        s.add_registered_method_handlers = lambda name, handlers: (registered.append(name), add(name, handlers))[1]
        return s

    async def spy_wait(fs, *args, **kwargs):  # type: ignore[no-untyped-def]
        fs = list(fs)
        waited.append(len(fs))
        return await real_wait(fs, *args, **kwargs)

    monkeypatch.setattr(grpc.aio, "server", spy_server)
    monkeypatch.setattr(asyncio, "wait", spy_wait)
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            req = pb.DecideRequest(headers={"X-Tenant": "acme-bank", "X-Data-Region": "us-west"})
            for _ in range(5):
                assert stub.Decide(req, timeout=30).outcome == pb.ADMITTED
            assert len(stub.DecideBatch(pb.DecideBatchRequest(requests=[req, req]), timeout=30).decisions) == 2
            h = health_pb2_grpc.HealthStub(ch)
            assert h.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=30).status == \
                health_pb2.HealthCheckResponse.SERVING
            watch = h.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=30)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
            r = reflection_pb2_grpc.ServerReflectionStub(ch)
            (resp,) = list(r.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                  timeout=30))
            assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= \
                {s.name for s in resp.list_services_response.service}
    finally:
        th.stop()
    assert registered == []
    assert waited and max(waited) == 1  # one pending request-call (the generic handlers'), never one per method
