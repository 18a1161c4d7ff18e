"""The Endpoint Picker Protocol's candidate subset (`envoy.lb.subset_hint` /
`x-gateway-destination-endpoint-subset` in the request's filter metadata), at the picker's
ext_proc stream: a real picker and decision service, the messages Envoy would send. Only
the subset's endpoints may be picked; a subset none of whose instances is admissible is a
503 with the reason. (No Envoy here: the gateway rig's bootstrap does not yet put a subset
in the metadata it forwards.)"""

from __future__ import annotations

import asyncio
from typing import Iterator

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from gateway_rig import PRIMARY, SMALL

from policyc.compiler.bundle import Bundle
from policyc.gateway.picker import SUBSET_KEY, SUBSET_NAMESPACE, PickerConfig
from policyc.gateway.server import EXT_PROC_SERVICE, PickerServer
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet

PATH = f"/{EXT_PROC_SERVICE}/Process"


@pytest.fixture(scope="module")
def rig(bundle: Bundle) -> Iterator[tuple[ServerThread, int, list[str]]]:
    server = DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE))
    thread = ServerThread(server)
    thread.start()
    assert server.cluster is not None
    fleet = [i for i in admissible_fleet(bundle, server.cluster.gpu_slots()) if i.model == PRIMARY][:6]
    assert len(fleet) >= 3
    fleet = [i.model_copy(update={"deployment": i.deployment.model_copy(update={"endpoint": f"127.0.0.1:{20001 + n}"})})
             for n, i in enumerate(fleet)]
    server.engine.register_many(fleet)
    picker = PickerServer(server, PickerConfig())
    port = thread.call(picker.start())
    yield thread, port, [i.deployment.endpoint for i in fleet]
    thread.call(picker.stop(grace=0.1))
    thread.stop()


def _headers(subset: list[str] | None) -> ep.ProcessingRequest:
    req = ep.ProcessingRequest()
    for k, v in ((":method", "POST"), (":path", "/inference.GRPCInferenceService/ModelInfer"), ("x-model", PRIMARY),
                 ("x-data-region", "us-west"), ("x-tenant", "acme-bank")):
        req.request_headers.headers.headers.append(base_pb2.HeaderValue(key=k, raw_value=v.encode()))
    if subset is not None:
        lst = req.metadata_context.filter_metadata[SUBSET_NAMESPACE].fields[SUBSET_KEY].list_value
        lst.SetInParent()
        for e in subset:
            lst.values.add().string_value = e
    return req


def _pick(port: int, subset: list[str] | None) -> ep.ProcessingResponse:
    async def run() -> ep.ProcessingResponse:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.stream_stream(PATH, request_serializer=ep.ProcessingRequest.SerializeToString,
                                    response_deserializer=ep.ProcessingResponse.FromString)(timeout=30)
            await call.write(_headers(subset))
            answer = await call.read()
            await call.done_writing()
            assert answer is not grpc.aio.EOF
            return answer

    return asyncio.run(run())


def _endpoints(r: ep.ProcessingResponse) -> list[str]:
    assert r.HasField("request_headers"), r
    return r.dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value.split(",")


def test_without_a_subset_the_pool_is_the_candidates(rig: tuple[ServerThread, int, list[str]]) -> None:
    _, port, endpoints = rig
    assert _endpoints(_pick(port, None))[0] in endpoints


def test_a_subset_restricts_the_pick(rig: tuple[ServerThread, int, list[str]]) -> None:
    _, port, endpoints = rig
    first = _endpoints(_pick(port, None))[0]
    others = [e for e in endpoints if e != first]
    for allowed in ([others[0]], others[1:3]):
        got = _endpoints(_pick(port, allowed))
        assert got[0] in allowed and all(e in allowed for e in got), (allowed, got)
    # entries that are no `ip:port` name no instance; the others still count (spaces trimmed)
    got = _endpoints(_pick(port, ["not-an-endpoint", "10.0.0.1:99999", f" {others[0]} "]))
    assert got == [others[0]], got


def test_a_subset_with_no_admissible_instance_is_refused_503_with_the_reason(rig: tuple[ServerThread, int, list[str]]) -> None:
    _, port, _ = rig
    for subset in (["10.9.9.9:8000"], []):
        r = _pick(port, subset)
        assert r.HasField("immediate_response"), r
        ir = r.immediate_response
        assert ir.status.code == 503
        reason = {h.header.key: h.header.raw_value.decode() for h in ir.headers.set_headers}["x-policyc-reason"]
        assert "candidate subset" in reason, reason
