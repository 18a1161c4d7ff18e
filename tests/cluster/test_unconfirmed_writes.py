"""Writes the fleet store did not confirm are reported as unknown, never as not done.

A real 3-member etcd cluster loses quorum (two members stopped with SIGSTOP, so requests
sent to them wait in their socket buffers, as in the attack that found the hole). A
RegisterInstance and a DeregisterInstance on a replica answer UNAVAILABLE with an ErrorInfo
(E730, `outcome: unknown`, the request id); after SIGCONT the replica settles and logs each
outcome, which agrees with what the store holds; a retry with the same request id converges
(on this replica and the other) without a second write, and a request id reused for another
request is refused.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import grpc
import pytest
from cluster_rig import SMALL, TTL, eventually, new_prefix, stub
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from policyc.cluster.config import FleetConfig
from policyc.cluster.etcd_store import EtcdStore
from policyc.cluster.keys import Keys
from policyc.cluster.registry_ledger import Outcome, Record
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb

OP_TIMEOUT = 1.5  # the stalled replica gives up on a write after this (+1 s): keeps the test short


def _replica(bundle: Any, etcd: Any, name: str, prefix: str, op_timeout: float) -> ServerThread:
    fleet = FleetConfig(etcd=tuple(etcd.endpoints), name=name, prefix=prefix, lease_ttl=TTL, report_interval=0.3,
                        op_timeout=op_timeout)
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE, watch_gpus=False,
                                                         fleet=fleet, open_fleet=True)))
    th.start()
    return th


def _register_msg(inst: Any) -> pb.RegisterInstanceRequest:
    dep = {k: v for k, v in inst.deployment.model_dump().items() if k in pb.Deployment.DESCRIPTOR.fields_by_name}
    return pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep))


def _error_info(e: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    st = rpc_status.from_call(e)  # type: ignore[arg-type]
    assert st is not None, f"no google.rpc.Status in {e}"
    for d in st.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            return info
    raise AssertionError(f"no ErrorInfo in {st}")


def _store_state(etcd: Any, keys: Keys, instance_id: str, request_id: str) -> tuple[int, Record | None]:
    """(how many instance keys of that id, the request record) as etcd holds them now."""
    async def read() -> tuple[int, Record | None]:
        s = EtcdStore(etcd.endpoints)
        await s.connect()
        try:
            snap = await s.read_prefix(keys.instances)
            n = sum(1 for e in snap.entries if e.key == keys.instance(instance_id))
            got = await s.get(keys.request(request_id))
            return n, None if got is None else Record.decode(got.key, got.value)
        finally:
            await s.close()
    return asyncio.run(read())


def _quorum_lost(etcd: Any) -> list[Any]:
    """Stop the leader and one follower: the member left cannot commit anything."""
    leader = etcd.leader()
    other = next(m for m in etcd.members if m is not leader)
    for m in (leader, other):
        etcd.pause(m)
    return [leader, other]


def _settled_line(caplog: pytest.LogCaptureFixture, request_id: str) -> str:
    lines = [r.getMessage() for r in caplog.records if request_id in r.getMessage() and "is settled" in r.getMessage()]
    assert len(lines) == 1, f"expected one settled line for {request_id}, got {lines}"
    return lines[0]


def test_unconfirmed_register_and_deregister_are_unknown_then_settled_and_retries_converge(bundle, etcd, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="policyc.cluster")
    prefix = new_prefix()
    keys = Keys(prefix)
    a = _replica(bundle, etcd, "a", prefix, OP_TIMEOUT)
    b = _replica(bundle, etcd, "b", prefix, 5.0)
    ch_a, sa = stub(a)
    ch_b, sb = stub(b)
    try:
        warm, inst = admissible_fleet(bundle, a.server.cluster.gpu_slots(), models=["fraud-scorer"])[:2]
        # a first registration while the store is healthy (the ledger's records lease is granted then)
        sa.RegisterInstance(_register_msg(warm), metadata=(("x-request-id", "warm-" + uuid.uuid4().hex),), timeout=30)
        for th in (a, b):
            eventually(lambda th=th: warm.id in th.server.state.registry, 10)
        with pytest.raises(grpc.RpcError) as bad:  # an id that cannot name a request (it becomes part of a key)
            sb.RegisterInstance(_register_msg(inst), metadata=(("x-request-id", "../instances/x"),), timeout=30)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and _error_info(bad.value).metadata["field"] == "x-request-id"
        assert inst.id not in b.server.state.registry

        # ---------------------------------------------------------------- register, quorum lost
        rid = "reg-" + uuid.uuid4().hex
        stopped = _quorum_lost(etcd)
        try:
            with pytest.raises(grpc.RpcError) as err:
                sa.RegisterInstance(_register_msg(inst), metadata=(("x-request-id", rid),), timeout=30)
        finally:
            for m in stopped:
                etcd.resume(m)
        e = err.value
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        info = _error_info(e)
        assert (info.reason, info.metadata["outcome"], info.metadata["request_id"]) == ("E730", "unknown", rid)
        assert info.metadata["operation"] == "registration" and info.metadata["instance_id"] == inst.id
        assert "unknown" in e.details() and "not registered" not in e.details()

        replica = a.server.replica
        eventually(lambda: rid in replica.settled, 40, step=0.05)
        outcome = replica.settled[rid]
        line = _settled_line(caplog, rid)
        assert outcome.value in line and inst.id in line
        n, rec = _store_state(etcd, keys, inst.id, rid)
        assert rec is not None and rec.state == ("applied" if outcome is Outcome.APPLIED else "abandoned")
        assert n == (1 if outcome is Outcome.APPLIED else 0), f"the log says {outcome.value}, the store holds {n} record(s)"

        # the retry with the same id converges, on either replica, without a second write
        sa.RegisterInstance(_register_msg(inst), metadata=(("x-request-id", rid),), timeout=30)
        sb.RegisterInstance(_register_msg(inst), metadata=(("x-request-id", rid),), timeout=30)
        for th in (a, b):
            eventually(lambda th=th: inst.id in th.server.state.registry and len(th.server.state.registry) == 2, 15)
        n, rec = _store_state(etcd, keys, inst.id, rid)
        assert n == 1 and rec is not None and rec.state == "applied"
        # the same id for another request is refused, naming the header
        with pytest.raises(grpc.RpcError) as reused:
            sb.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=inst.id), metadata=(("x-request-id", rid),), timeout=30)
        assert reused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and _error_info(reused.value).reason == "E731"
        for th in (a, b):
            eventually(lambda th=th: inst.id in th.server.state.registry, 15)  # the refused removal changed nothing

        # ---------------------------------------------------------------- deregister, quorum lost
        rid2 = "dereg-" + uuid.uuid4().hex
        stopped = _quorum_lost(etcd)
        try:
            with pytest.raises(grpc.RpcError) as err:
                sa.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=inst.id), metadata=(("x-request-id", rid2),), timeout=30)
        finally:
            for m in stopped:
                etcd.resume(m)
        e = err.value
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        info = _error_info(e)
        assert (info.reason, info.metadata["outcome"], info.metadata["request_id"]) == ("E730", "unknown", rid2)
        assert "not taken" not in e.details() and "unknown" in e.details()

        eventually(lambda: rid2 in replica.settled, 40, step=0.05)
        outcome = replica.settled[rid2]
        assert outcome.value in _settled_line(caplog, rid2)
        n, rec = _store_state(etcd, keys, inst.id, rid2)
        assert rec is not None and n == (0 if outcome is Outcome.APPLIED else 1), f"the log says {outcome.value}, the store holds {n}"

        for s in (sa, sb, sa):  # retried, on both replicas: one removal, answered as done each time
            s.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=inst.id), metadata=(("x-request-id", rid2),), timeout=30)
        for th in (a, b):
            eventually(lambda th=th: inst.id not in th.server.state.registry and warm.id in th.server.state.registry, 15)
        n, rec = _store_state(etcd, keys, inst.id, rid2)
        assert n == 0 and rec is not None and rec.state == "applied"
        assert not replica.unsettled
    finally:
        ch_a.close()
        ch_b.close()
        for m in etcd.members:
            etcd.resume(m)
        a.stop()
        b.stop()
