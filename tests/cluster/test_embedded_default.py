"""The embedded default: one process, no etcd, and a registry that survives a restart
(the local store under a state directory); a second server on the same directory is
refused, and the store's own semantics (leases, watches, guarded transactions) hold."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from cluster_rig import SMALL

from policyc.client import operator_channel
from policyc.cluster.config import FleetConfig
from policyc.cluster.local_store import LocalStore, StateDirBusy
from policyc.cluster.store import ChangeKind, Guard, Put
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc


def _server(bundle, state_dir) -> ServerThread:  # type: ignore[no-untyped-def]
    cfg = ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE, watch_gpus=False,
                      fleet=FleetConfig(state_dir=state_dir, name="solo"))
    th = ServerThread(DecisionServer(bundle, cfg))
    th.start()
    return th


def test_the_registry_survives_a_restart(bundle, tmp_path) -> None:
    th = _server(bundle, tmp_path / "state")
    fleet = admissible_fleet(bundle, th.server.cluster.gpu_slots(), models=["fraud-scorer"])
    try:
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            s = pb_grpc.DecisionsStub(ch)
            for inst in fleet[:3]:
                dep = {k: v for k, v in inst.deployment.model_dump().items() if k in pb.Deployment.DESCRIPTOR.fields_by_name}
                s.RegisterInstance(pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep)))
            s.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=fleet[1].id))
        assert th.server.replica.election.token > 0  # one process: it is its own leader
    finally:
        th.stop()
    again = _server(bundle, tmp_path / "state")
    try:
        assert {i.id for i, _, _ in again.server.state.registry.entries()} == {fleet[0].id, fleet[2].id}
        with operator_channel(f"127.0.0.1:{again.server.port}") as ch:
            d = pb_grpc.DecisionsStub(ch).Decide(pb.DecideRequest(headers={"X-Model": "fraud-scorer"}))
        assert d.outcome == pb.ADMITTED and d.placement.instance_id in {fleet[0].id, fleet[2].id}
    finally:
        again.stop()


def test_two_servers_cannot_share_a_state_directory(tmp_path) -> None:
    async def go() -> None:
        a = LocalStore(tmp_path)
        await a.connect()
        try:
            with pytest.raises(StateDirBusy, match="in use by pid"):
                await LocalStore(tmp_path).connect()
        finally:
            await a.close()
    asyncio.run(go())


def test_local_leases_watches_and_transactions_behave_as_etcds(tmp_path) -> None:
    async def go() -> None:
        s = LocalStore(tmp_path)
        await s.connect()
        try:
            snap = await s.read_prefix("/p/")
            lease = await s.grant(1)
            await s.put("/p/held", b"x", lease)
            await s.put("/p/kept", b"y")
            ok, _ = await s.transact([Guard("/p/leader", create_revision=0)], [Put("/p/leader", b"a", lease)])
            again, _ = await s.transact([Guard("/p/leader", create_revision=0)], [Put("/p/leader", b"b", lease)])
            assert ok and not again
            seen = []
            async def follow() -> None:
                async for ch in s.watch("/p/", snap.revision + 1):
                    seen.append((ch.kind, ch.key))
                    if (ChangeKind.DELETE, "/p/leader") in seen:
                        return
            await asyncio.wait_for(follow(), 5)  # the lease lapses: its keys go, the others stay
            assert (ChangeKind.DELETE, "/p/held") in seen and await s.get("/p/kept") is not None
        finally:
            await s.close()
        s2 = LocalStore(tmp_path)  # a restart keeps durable keys only
        await s2.connect()
        try:
            assert [e.key for e in (await s2.read_prefix("/p/")).entries] == ["/p/kept"]
        finally:
            await s2.close()
    asyncio.run(go())


def test_a_registration_the_store_does_not_confirm_is_unknown_undone_here_and_settled_later(bundle, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from cluster_rig import eventually
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from policyc.cluster.registry_ledger import Outcome
    from policyc.cluster.store import StoreUnavailable

    th = _server(bundle, tmp_path / "state")
    try:
        inst = admissible_fleet(bundle, th.server.cluster.gpu_slots(), models=["fraud-scorer"])[0]

        async def down(*a: object, **k: object) -> tuple[bool, int]:
            raise StoreUnavailable("the store is down (injected)")
        monkeypatch.setattr(th.server.replica.store, "transact", down)
        dep = {k: v for k, v in inst.deployment.model_dump().items() if k in pb.Deployment.DESCRIPTOR.fields_by_name}
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.DecisionsStub(ch).RegisterInstance(
                    pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep)), timeout=10)
        e = info.value
        assert e.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert "outcome is unknown" in e.details() and "injected" in e.details()  # type: ignore[attr-defined]
        st = rpc_status.from_call(e)  # type: ignore[arg-type]
        assert st is not None
        err = error_details_pb2.ErrorInfo()
        next(d for d in st.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)).Unpack(err)
        rid = err.metadata["request_id"]
        assert err.reason == "E730" and err.metadata["outcome"] == "unknown" and rid
        assert inst.id not in th.server.state.registry  # not served here while unknown
        assert rid in th.server.replica.unsettled
        monkeypatch.undo()  # the store answers again: the replica settles it
        eventually(lambda: rid in th.server.replica.settled, 15)
        assert th.server.replica.settled[rid] is Outcome.NOT_APPLIED and inst.id not in th.server.state.registry
    finally:
        monkeypatch.undo()
        th.stop()


def test_a_restart_with_another_bundle_runs_that_bundle_and_keeps_the_registry(bundle, tmp_path) -> None:
    from cluster_rig import REPO

    from policyc.compiler.pipeline import compile_paths

    src = tmp_path / "policies"
    src.mkdir()
    for f in (REPO / "policies").glob("*.contract"):
        text = f.read_text()
        (src / f.name).write_text(text.replace("latency: <= 200 ms", "latency: <= 210 ms", 1)
                                  if f.name == "fraud-scorer-lite.contract" else text)
    second = compile_paths([str(src)], analyse=False).bundle
    assert second is not None and second.content_hash != bundle.content_hash
    th = _server(bundle, tmp_path / "state")
    inst = admissible_fleet(bundle, th.server.cluster.gpu_slots(), models=["fraud-scorer"])[0]
    try:
        th.server.engine.register(inst)
    finally:
        th.stop()
    again = _server(second, tmp_path / "state")  # one process: the bundle it is started with is in force
    try:
        assert again.server.state.bundle_hash == second.content_hash
        assert inst.id in again.server.state.registry
    finally:
        again.stop()
