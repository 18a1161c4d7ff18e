"""The request ledger on a real etcd cluster, case by case: a write whose answer was lost
settles as applied; one that never arrived settles as not applied and a late copy of it
then changes nothing; a retry after either converges; an id reused for another request is
refused; the records live under a lease."""

from __future__ import annotations

import asyncio

import pytest

from policyc.cluster.etcd_store import EtcdStore
from policyc.cluster.keys import Keys
from policyc.cluster.registry_ledger import Ledger, Op, Outcome, Record, RegistryWrite, RequestReused, valid_request_id
from policyc.cluster.store import Guard, Put
from cluster_rig import new_prefix


def _run(etcd, body):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        store = EtcdStore(etcd.endpoints)
        await store.connect()
        try:
            return await body(store, Keys(new_prefix()))
        finally:
            await store.close()
    return asyncio.run(go())


def test_a_write_whose_answer_was_lost_settles_as_applied_and_its_retry_is_not_a_second_write(etcd) -> None:  # type: ignore[no-untyped-def]
    async def body(store, keys):  # type: ignore[no-untyped-def]
        ledger = Ledger(store, keys, "r0")
        w = RegistryWrite(Op.REGISTER, "m@h/g0", "req-1", b'{"instance":{}}')
        assert await ledger.apply(w) is Outcome.APPLIED  # landed; say its answer never came back
        first = await store.get(keys.instance(w.instance_id))
        assert await ledger.settle(w) is Outcome.APPLIED
        assert await ledger.apply(w) is Outcome.APPLIED  # the client's retry
        again = await store.get(keys.instance(w.instance_id))
        assert first is not None and again is not None and again.mod_revision == first.mod_revision  # not written twice
        assert await ledger.applied_before(w)
        rec = await store.get(keys.request("req-1"))
        assert rec is not None and rec.lease != 0 and Record.decode(rec.key, rec.value).state == "applied"
    _run(etcd, body)


def test_a_write_settled_as_not_applied_cannot_land_late_and_a_retry_applies_it(etcd) -> None:  # type: ignore[no-untyped-def]
    async def body(store, keys):  # type: ignore[no-untyped-def]
        ledger = Ledger(store, keys, "r0")
        w = RegistryWrite(Op.REGISTER, "m@h/g1", "req-2", b'{"instance":{}}')
        assert await ledger.settle(w) is Outcome.NOT_APPLIED  # the write never reached the store
        # the late copy: the very transaction `apply` sends, arriving after the settlement
        lease = await store.grant(60)
        ok, _ = await store.transact([Guard(keys.request(w.request_id), create_revision=0)],
                                     [Put(keys.instance(w.instance_id), w.value), Put(keys.request(w.request_id), b"{}", lease)])
        assert not ok and await store.get(keys.instance(w.instance_id)) is None
        assert not await ledger.applied_before(w)
        assert await ledger.apply(w) is Outcome.APPLIED  # the retry with the same id registers it
        assert await store.get(keys.instance(w.instance_id)) is not None
        assert await ledger.settle(w) is Outcome.APPLIED
        # removal, same rules
        d = RegistryWrite(Op.DEREGISTER, w.instance_id, "req-3")
        assert await ledger.apply(d) is Outcome.APPLIED and await store.get(keys.instance(w.instance_id)) is None
        assert await ledger.apply(d) is Outcome.APPLIED
    _run(etcd, body)


def test_a_request_id_reused_for_another_request_is_refused(etcd) -> None:  # type: ignore[no-untyped-def]
    async def body(store, keys):  # type: ignore[no-untyped-def]
        ledger = Ledger(store, keys, "r0")
        await ledger.apply(RegistryWrite(Op.REGISTER, "m@h/g2", "req-4", b"{}"))
        with pytest.raises(RequestReused, match="req-4"):
            await ledger.apply(RegistryWrite(Op.REGISTER, "m@h/g2", "req-4", b'{"other":1}'))
        with pytest.raises(RequestReused):
            await ledger.apply(RegistryWrite(Op.DEREGISTER, "m@h/g2", "req-4"))
        assert await store.get(keys.instance("m@h/g2")) is not None
    _run(etcd, body)


@pytest.mark.parametrize("rid, ok", [("6f1c2b9e-3c1d-4a8e-9d7a-1f2e3d4c5b6a", True), ("a" * 128, True), ("a" * 129, False),
                                     ("", False), ("a/b", False), ("x y", False), ("ü", False)])
def test_request_ids_that_can_name_a_key(rid: str, ok: bool) -> None:
    assert valid_request_id(rid) is ok
