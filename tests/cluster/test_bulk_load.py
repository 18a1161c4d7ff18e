"""A replica starting on a fleet store that already holds instances loads them in one
columnar batch (`Registry.add_batch` from the stored records, no object per instance) and
answers as a replica that registered them one by one does; what it must not serve (a
record with a bad field, an instance its bundle does not admit, an endpoint the endpoint
rules refuse) is dropped at load, naming the record and why."""

from __future__ import annotations

import asyncio
import json

from cluster_rig import new_prefix, replica

from policyc.cluster import instance_codec
from policyc.cluster.etcd_store import EtcdStore
from policyc.cluster.keys import Keys
from policyc.server.decision import DecisionInput
from policyc.server.fleet import admissible_fleet
from policyc.server.request_input import to_request


def _put_all(etcd, prefix: str, records: dict[str, bytes]) -> None:  # type: ignore[no-untyped-def]
    async def put() -> None:
        s = EtcdStore(etcd.endpoints)
        await s.connect()
        try:
            for key, value in records.items():
                await s.put(key, value)
        finally:
            await s.close()
    asyncio.run(put())


def _answers(th, bundle):  # type: ignore[no-untyped-def]
    """Every contract's candidates (ids, in the registry's order) and every entry."""
    reg = th.server.state.registry
    out = {}
    for c in bundle.contracts:
        q, _ = to_request(reg, bundle, DecisionInput(headers={"X-Model": c.name}, attributes={}))
        out[c.name] = list(reg.matches(q, "ids").ids)
    return out, {i.id: (i, s) for i, _, s in reg.entries()}


def test_a_replica_loads_the_store_in_bulk_and_answers_as_one_that_registered_one_by_one(bundle, etcd) -> None:  # type: ignore[no-untyped-def]
    one_by_one = replica(bundle, etcd, "one-by-one", new_prefix())
    loaded = None
    try:
        fleet = admissible_fleet(bundle, one_by_one.server.cluster.gpu_slots())
        assert len({i.model for i in fleet}) > 1
        scores = {inst.id: round(0.1 + (n % 7) / 10, 2) for n, inst in enumerate(fleet) if n % 3 == 0}
        for inst in fleet:
            one_by_one.server.engine.register(inst, scores.get(inst.id))

        prefix = new_prefix()
        keys = Keys(prefix)
        records = {keys.instance(i.id): instance_codec.encode(i, scores.get(i.id)) for i in fleet}
        good = fleet[0].model_dump(mode="json")
        bad_numa = json.loads(json.dumps(good)) | {"id": "bad-numa"}
        bad_numa["deployment"]["numa_node"] = "zero"
        records[keys.instance("bad-numa")] = json.dumps({"instance": bad_numa}).encode()
        records[keys.instance("not-json")] = b"{not json"
        unknown_model = json.loads(json.dumps(good)) | {"id": "unknown-model", "model": "no-such-contract"}
        records[keys.instance("unknown-model")] = json.dumps({"instance": unknown_model}).encode()
        metadata = json.loads(json.dumps(good)) | {"id": "metadata-endpoint"}
        metadata["deployment"]["endpoint"] = "169.254.169.254:80"
        records[keys.instance("metadata-endpoint")] = json.dumps({"instance": metadata}).encode()
        _put_all(etcd, prefix, records)

        loaded = replica(bundle, etcd, "bulk", prefix)
        rep = loaded.server.replica
        assert len(loaded.server.state.registry) == len(fleet)
        got, got_entries = _answers(loaded, bundle)
        want, want_entries = _answers(one_by_one, bundle)
        assert got == want and {k: i for k, (i, _) in got_entries.items()} == {k: i for k, (i, _) in want_entries.items()}
        # a given score is kept as given (the running replica's placer has moved its own since;
        # the others take the GPU's current placer score on each replica)
        assert {i: got_entries[i][1] for i in scores} == scores

        dropped = {r.instance_id: r for r in rep.dropped_at_load}
        assert set(dropped) == {"unknown-model", "metadata-endpoint"}
        assert dropped["unknown-model"].field == "model" and "no-such-contract" in dropped["unknown-model"].reason
        assert dropped["metadata-endpoint"].field == "deployment.endpoint"
        assert "cloud-metadata-address" in dropped["metadata-endpoint"].reason
        assert dropped["metadata-endpoint"].where == keys.instance("metadata-endpoint")
        # the store's instances are all remembered (to re-apply after a bundle change), admitted or not
        assert "unknown-model" in rep._known and "bad-numa" not in rep._known
        assert rep._known[fleet[0].id] == (fleet[0], scores.get(fleet[0].id))
    finally:
        one_by_one.stop()
        if loaded is not None:
            loaded.stop()


def test_a_bad_store_record_is_refused_naming_the_record_and_the_field(bundle, etcd, caplog) -> None:  # type: ignore[no-untyped-def]
    from policyc.server.bulk_registration import batch_from_records
    key = "/fleet/instances/bad-numa"
    rec = {"id": "bad-numa", "model": "fraud-scorer",
           "deployment": {"host": "h", "gpu": "g", "gpu_model": "H100", "region": "eu-west", "numa_node": "zero"}}
    ok = dict(rec, id="fine", deployment=dict(rec["deployment"], numa_node=0))
    batch, positions, refused = batch_from_records([(key, rec, None), ("/fleet/instances/fine", ok, 0.5)])
    assert batch.ids == ["fine"] and positions == [1] and batch.scores == [0.5]
    [r] = refused
    assert (r.index, r.where, r.instance_id, r.field) == (0, key, "bad-numa", "deployment.numa_node")
    assert key in r.reason and "numa_node" in r.reason

    prefix = new_prefix()
    _put_all(etcd, prefix, {Keys(prefix).instance("bad-numa"): json.dumps({"instance": rec}).encode()})
    caplog.set_level("WARNING")
    th = replica(bundle, etcd, "bad-record", prefix)
    try:
        assert len(th.server.state.registry) == 0
        assert any(Keys(prefix).instance("bad-numa") in m and "numa_node" in m for m in caplog.messages)
    finally:
        th.stop()


def test_a_prefix_is_read_a_page_at_a_time_at_one_revision(etcd, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A 100,000-instance snapshot is ~40 MB, ten times gRPC's message limit in one Range."""
    from policyc.cluster import etcd_store
    monkeypatch.setattr(etcd_store, "READ_PAGE", 7)
    prefix = new_prefix()
    _put_all(etcd, prefix, {f"{prefix}k{i:03d}": str(i).encode() for i in range(30)})

    async def read():  # type: ignore[no-untyped-def]
        s = EtcdStore(etcd.endpoints)
        await s.connect()
        try:
            snap = await s.read_prefix(prefix)
            await s.put(f"{prefix}k999", b"later")  # after the read: not in it
            return snap, await s.read_prefix(prefix)
        finally:
            await s.close()
    snap, again = asyncio.run(read())
    assert [e.key for e in snap.entries] == [f"{prefix}k{i:03d}" for i in range(30)]
    assert [e.value for e in snap.entries] == [str(i).encode() for i in range(30)]
    assert len(again.entries) == 31 and again.revision > snap.revision


# ------------------------------------------------------------------ the screen, held to one by one
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from policyc.matcher import Instance, Registry, RegistryError  # noqa: E402
from policyc.placer.simulator import SimulatedCluster  # noqa: E402
from policyc.server.bulk_registration import screen  # noqa: E402

_SLOTS = SimulatedCluster(1, 4, 2).gpu_slots()
_SPOIL = ("keep", "keep", "keep", "unknown-model", "other-region", "metadata", "duplicate")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(_SPOIL), st.none() | st.floats(0, 1)),
                min_size=1, max_size=40))
def test_the_bulk_screen_registers_what_one_by_one_would(bundle, picks) -> None:  # type: ignore[no-untyped-def]
    """Records spoiled at random (an unknown model, a region the contract refuses, a
    metadata endpoint, an id given twice): screen + one `add_batch` leaves the registry that
    checking and adding them one by one leaves, and refuses the same ids."""
    fleet = admissible_fleet(bundle, _SLOTS)
    records = []
    for n, (k, how, score) in enumerate(picks):
        rec = fleet[k % len(fleet)].model_dump(mode="json")
        rec["id"] = f"i{n}" if how != "duplicate" or n == 0 else "i0"
        if how == "unknown-model":
            rec["model"] = "no-such-contract"
        elif how == "other-region":
            rec["deployment"]["region"] = "antarctica"
        elif how == "metadata":
            rec["deployment"]["endpoint"] = "169.254.169.254:80"
        records.append((f"k{n}", rec, score))

    def endpoint(iid: str, ep: str, host: str) -> str | None:
        return "cloud-metadata-address" if ep.startswith("169.254.169.254") else None

    from policyc.matcher.columns import InstanceBatch
    keep, _, refused = screen(InstanceBatch.from_records(records), bundle, endpoint=endpoint)
    bulk = Registry(bundle, prebuild=False)
    bulk.add_batch(keep)

    one = Registry(bundle, prebuild=False)
    want_refused = []
    for _, rec, score in records:
        inst = Instance.model_validate(rec)
        if inst.deployment.endpoint and endpoint(inst.id, inst.deployment.endpoint, inst.deployment.host):
            want_refused.append(inst.id)
            continue
        try:
            one.add(inst, score)
        except RegistryError:
            want_refused.append(inst.id)
    assert [r.instance_id for r in refused] == want_refused
    assert sorted((i.id, i, s) for i, _, s in bulk.entries()) == sorted((i.id, i, s) for i, _, s in one.entries())
    for c in bundle.contracts:
        q, _ = to_request(one, bundle, DecisionInput(headers={"X-Model": c.name}, attributes={}))
        assert set(bulk.matches(q, "ids").ids) == set(one.matches(q, "ids").ids)
