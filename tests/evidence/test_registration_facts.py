"""Registration checks an instance's deployment facts against the topology that knows them:
a GPU class, NUMA node, host or security fact that disagrees is refused naming the fact and
both values; with no source, the facts come back as unverified. Over the real
`RegisterInstance` RPC of a running decision service."""

from __future__ import annotations

from typing import Iterator

import grpc
import pytest

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.server import convert
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb_grpc
from policyc.server.registration import check_facts

SMALL = ClusterSpec(seed=1, hosts=32, gpus_per_host=4, hosts_per_rack=4)


@pytest.fixture(scope="module")
def served(bundle: Bundle) -> Iterator[tuple[DecisionServer, pb_grpc.DecisionsStub]]:
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.OFF)))
    th.start()
    with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
        yield th.server, pb_grpc.DecisionsStub(ch)
    th.stop()


def a_true_instance(bundle: Bundle, server: DecisionServer, model: str = "fraud-scorer"):  # type: ignore[no-untyped-def]
    assert server.cluster is not None
    return next(i for i in admissible_fleet(bundle, server.cluster.gpu_slots(), models=[model]))


def refusal(stub: pb_grpc.DecisionsStub, inst) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        stub.RegisterInstance(convert.register_request(inst), timeout=10)
    return e.value


def test_true_facts_are_registered_and_say_nothing_is_unverified(bundle: Bundle, served) -> None:  # type: ignore[no-untyped-def]
    server, stub = served
    inst = a_true_instance(bundle, server)
    got = stub.RegisterInstance(convert.register_request(inst.model_copy(update={"id": "true-facts"})), timeout=10)
    assert list(got.unverified_facts) == []


@pytest.mark.parametrize("fact", ["gpu_model", "numa_node", "host", "gpu", "region", "session_state"])
def test_a_fact_the_topology_contradicts_is_refused_naming_it_and_both_values(
        bundle: Bundle, served, fact: str) -> None:  # type: ignore[no-untyped-def]
    server, stub = served
    assert server.cluster is not None
    fleet = admissible_fleet(bundle, server.cluster.gpu_slots())
    # a value another admissible instance of the same model really has (so the contract
    # admits the claim and only the telemetry can tell it is false), or a host/GPU that
    # does not exist
    claimed: object = {"host": "host-9999", "gpu": "gpu42"}.get(fact)
    inst = fleet[0]
    if claimed is None:
        inst, claimed = next((i, getattr(j.deployment, fact)) for i in fleet for j in fleet
                             if i.model == j.model and getattr(j.deployment, fact) != getattr(i.deployment, fact))
    d = inst.deployment
    lie = inst.model_copy(update={"id": f"lie-{fact}", "deployment": d.model_copy(update={fact: claimed})})
    e = refusal(stub, lie)
    assert e.code() is grpc.StatusCode.FAILED_PRECONDITION, e.details()
    assert f"`deployment.{fact}` is `{claimed}`" in e.details(), e.details()
    if fact not in ("host", "gpu"):
        assert f"as `{getattr(d, fact)}`" in e.details(), e.details()  # the topology's value, named


def test_with_no_topology_every_fact_is_unverified(bundle: Bundle, served) -> None:  # type: ignore[no-untyped-def]
    server, _ = served
    unverified = check_facts(a_true_instance(bundle, server), None)
    assert "gpu_model" in unverified and "host" in unverified and "tpm" in unverified
