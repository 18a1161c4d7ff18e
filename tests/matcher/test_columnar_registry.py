"""The columnar registry (`matcher/columns.py`, `Registry.add_batch`) keeps the reference
meaning: a fleet registered as columns, as store records or one object at a time answers
every request alike, in every answer form, and equal to the naive scan; bad records are
refused naming the record and the field, and a refused batch changes nothing."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyc.matcher import (AdmissionError, Instance, InstanceBatch, Registry, RegistryError, UnknownInstanceError,
                             attributes)

from fleet_shapes import KINDS, make_fleet, make_fleet_batch, request_headers
from test_fleet_scale import naive_order, forms_agree

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _with_extras(insts: list[Instance], rng: random.Random) -> list[Instance]:
    """Some instances with labels of their own and endpoints (the per-instance row path)."""
    out = []
    for n, inst in enumerate(insts):
        upd: dict[str, object] = {}
        if rng.random() < 0.3:
            upd["labels"] = {"rack": f"r{rng.randrange(3)}"}
        if rng.random() < 0.3:
            upd["deployment"] = inst.deployment.model_copy(update={"endpoint": f"10.0.{n // 250}.{n % 250 + 1}:8000"})
        out.append(inst.model_copy(update=upd) if upd else inst)
    return out


@SETTINGS
@given(seed=st.integers(0, 2**32), n=st.integers(1, 250), families=st.integers(1, 4), reqs=st.integers(1, 6),
       extras=st.booleans())
def test_columns_records_and_objects_answer_alike(seed: int, n: int, families: int, reqs: int, extras: bool) -> None:
    rng = random.Random(seed)
    fleet = make_fleet(n, seed, families=families)
    insts = _with_extras(fleet.instances, rng) if extras else fleet.instances
    by_batch = Registry(fleet.bundle, shard_size=8, prebuild=False)
    by_batch.add_batch(InstanceBatch.from_instances(insts, fleet.scores))
    by_records = Registry(fleet.bundle, shard_size=8, prebuild=False)
    by_records.add_batch(InstanceBatch.from_records(
        (f"instances/{i.id}", i.model_dump(mode="json"), fleet.scores[i.id]) for i in insts))
    one_by_one = Registry(fleet.bundle, shard_size=8, prebuild=False)
    for inst in insts:
        one_by_one.add(inst, fleet.scores[inst.id])
    for reg in (by_batch, by_records):
        assert {i.id: i for i, _, _ in reg.entries()} == {i.id: i for i in insts}
        for inst, attrs, score in reg.entries():  # rows rebuilt from columns are the reference attributes
            assert dict(attrs) == attributes(inst, fleet.bundle.contract(inst.model), fleet.bundle)  # type: ignore[arg-type]
            assert score == one_by_one.score(inst.id)
        assert {i.id for i in reg.routable()} == {i.id for i in insts if i.deployment.endpoint}
    for i in range(reqs):
        q = by_batch.parse_request(request_headers(KINDS[i % 4], rng, families))
        order, ids, _ = naive_order(one_by_one, dict(q.vars), len(insts))
        for reg in (by_batch, by_records, one_by_one):
            forms_agree(reg, q, ids)
            assert tuple(s.instance.id for s in reg.match(q, 5).best) == order[:5]
    gone = rng.sample(insts, min(len(insts), 5))  # changes after a columnar build: removed, updated, re-added
    for inst in gone:
        by_batch.remove(inst.id)
    for inst in gone[:2]:
        by_batch.add(inst, 0.25)
    if insts and insts[0] not in gone:
        moved = insts[0].model_copy(update={"labels": {"rack": "moved"}})
        by_batch.update(moved)
        assert by_batch.get(moved.id) == moved
    q = by_batch.parse_request(request_headers("broad", rng, families))
    _, ids, _ = naive_order(by_batch, dict(q.vars), len(by_batch))
    forms_agree(by_batch, q, ids)


def test_fleet_batch_is_the_fleet() -> None:
    """The benchmark's columnar fleet is `make_fleet`'s, draw for draw."""
    a, b = make_fleet(2000, 3), make_fleet_batch(2000, 3)
    assert a.bundle.content_hash == b.bundle.content_hash
    assert [b.batch.instance(i) for i in range(len(b.batch))] == a.instances
    assert b.batch.scores == [a.scores[i.id] for i in a.instances]


def test_swap_bundle_on_columns_evicts_and_keeps_answers() -> None:
    big, small = make_fleet_batch(600, 5), make_fleet(300, 5)
    reg = Registry(big.bundle, shard_size=8, prebuild=False)
    reg.add_batch(big.batch)
    keep = {c.name for c in small.bundle.contracts}
    with pytest.raises(RegistryError, match="does not admit registered instances"):
        reg.swap_bundle(small.bundle)
    assert len(reg) == 600
    evicted = reg.swap_bundle(small.bundle, evict_inadmissible=True)
    assert set(evicted) == {i for i, m in zip(big.batch.ids, big.batch.models) if m not in keep}
    assert len(reg) == 600 - len(evicted)
    rng = random.Random(1)
    for kind in KINDS:
        q = reg.parse_request(request_headers(kind, rng))
        _, ids, _ = naive_order(reg, dict(q.vars), len(reg))
        forms_agree(reg, q, ids)


GOOD = {"id": "m-1", "model": "model-00-100ms",
        "deployment": {"host": "h1", "gpu": "gpu0", "gpu_model": "H100", "region": "us-west"}, "labels": {}}
BAD_RECORDS = [
    ("not an object", "an instance record must be an object"),
    ({**GOOD, "colour": "red"}, "unknown field"),
    ({**GOOD, "id": 7}, "`id` must be a string"),
    ({**GOOD, "deployment": "h1"}, "`deployment` must be an object"),
    ({**GOOD, "deployment": {**GOOD["deployment"], "rack": 1}}, "unknown deployment field"),  # type: ignore[dict-item]
    ({**GOOD, "deployment": {**GOOD["deployment"], "tpm": "yes"}}, "deployment.tpm must be true or false"),  # type: ignore[dict-item]
    ({**GOOD, "deployment": {**GOOD["deployment"], "numa_node": -1}}, "numa_node must be an integer"),  # type: ignore[dict-item]
    ({**GOOD, "deployment": {**GOOD["deployment"], "endpoint": "example.com:80"}}, "deployment.endpoint"),  # type: ignore[dict-item]
    ({**GOOD, "deployment": {**GOOD["deployment"], "region": "x" * 5000}}, "longer than"),  # type: ignore[dict-item]
    ({**GOOD, "labels": {"rack": 3}}, "`labels` must map strings to strings"),
]


@pytest.mark.parametrize("record,problem", BAD_RECORDS, ids=[p for _, p in BAD_RECORDS])
def test_bad_records_are_refused_naming_record_and_field(record: object, problem: str) -> None:
    with pytest.raises(RegistryError, match="instances/m-1: .*" + problem.replace("(", r"\(")):
        InstanceBatch.from_records([("instances/ok", GOOD, None), ("instances/m-1", record, None)])


def test_bad_scores_and_a_refused_batch_change_nothing() -> None:
    fleet = make_fleet_batch(200, 2)
    with pytest.raises(RegistryError, match="score must be a number in"):
        InstanceBatch.from_records([("instances/m-1", GOOD, 1.5)])
    reg = Registry(fleet.bundle, shard_size=8, prebuild=False)
    reg.add_batch(fleet.batch)
    before = {i.id for i, _, _ in reg.entries()}
    dup = InstanceBatch.from_records([("a", {**GOOD, "id": "new-1"}, None), ("b", {**GOOD, "id": fleet.batch.ids[0]}, None)])
    with pytest.raises(RegistryError, match="already registered"):
        reg.add_batch(dup)
    unknown = InstanceBatch.from_records([("a", {**GOOD, "id": "new-1", "model": "no-such-model"}, None)])
    with pytest.raises(AdmissionError, match="new-1"):
        reg.add_batch(unknown)
    assert {i.id for i, _, _ in reg.entries()} == before
    q = reg.parse_request({"X-SLO-Latency": "300ms"})
    with pytest.raises(UnknownInstanceError):
        reg.admits(q, "new-1")
    with pytest.raises(ValueError, match="form must be one of"):
        reg.matches(q, "rows")  # type: ignore[arg-type]
