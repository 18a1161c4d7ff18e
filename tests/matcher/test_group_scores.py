"""A score belongs to a (model, GPU) group: the instances of a model on one GPU are copies
of one choice and share the GPU's score. What each registry operation does to it, and the
registry against the reference scan on fleets where most instances have copies."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyc.compiler.bundle import Bundle
from policyc.matcher import Registry, RegistryError, Request, attributes, naive_match
from policyc.matcher.registry import DEFAULT_SCORE

from matcher_support import admissible
from test_differential import ops, requests, typed

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def copy(inst, iid: str, **deployment):  # type: ignore[no-untyped-def]
    return inst.model_copy(update={"id": iid, "deployment": inst.deployment.model_copy(update=deployment)})


def test_what_each_operation_does_to_a_group_score(policies_bundle: Bundle) -> None:
    a = admissible(policies_bundle, random.Random(1), "a", model="fraud-scorer")
    reg = Registry(policies_bundle)
    reg.add(a, 0.7)
    reg.add(copy(a, "b"))  # no score: its group's
    assert reg.score("b") == 0.7 and reg.groups_on(a.deployment.host, a.deployment.gpu) == 1
    reg.add(copy(a, "c"), 0.2)  # a given score is the group's
    assert [reg.score(i) for i in "abc"] == [0.2, 0.2, 0.2]
    reg.set_score("a", 0.9)  # one copy's score is every copy's
    assert [reg.score(i) for i in "abc"] == [0.9, 0.9, 0.9]
    other = "gpu7" if a.deployment.gpu != "gpu7" else "gpu6"
    reg.add(copy(a, "d", gpu=other))
    assert reg.score("d") == DEFAULT_SCORE  # a new group
    reg.update(copy(a, "c", gpu=other))  # joins d's group: takes its score
    assert reg.score("c") == DEFAULT_SCORE and reg.score("a") == 0.9
    reg.remove("d")
    reg.remove("c")
    reg.add(copy(a, "c", gpu=other))
    assert reg.score("c") == DEFAULT_SCORE  # the group had gone with its last member
    reg.set_score("c", 0.3)
    reg.update(copy(a, "c", gpu=other, numa_node=1 - a.deployment.numa_node))  # the same group, alone: keeps its score
    assert reg.score("c") == 0.3
    best = reg.match(Request.of({}), 10, distinct_gpus=True).best
    assert [(s.instance.id, s.score) for s in best] == [("a", 0.9), ("c", 0.3)]


def test_gpu_scores_move_every_group_on_the_gpu(policies_bundle: Bundle) -> None:
    rng = random.Random(2)
    fraud = admissible(policies_bundle, rng, "f0", model="fraud-scorer")
    host, gpu = fraud.deployment.host, fraud.deployment.gpu
    insts = [copy(fraud, f"f{n}") for n in range(3)]
    lite = admissible(policies_bundle, rng, "l0", model="fraud-scorer-lite")
    insts += [copy(lite, f"l{n}", host=host, gpu=gpu, gpu_model=fraud.deployment.gpu_model) for n in range(2)]
    reg = Registry(policies_bundle, insts, {"f1": 0.4})
    assert reg.groups_on(host, gpu) == 2 and reg.groups_on(host, "gpu99") == 0
    assert reg.score("f0") == 0.4 and reg.score("l0") == DEFAULT_SCORE
    assert reg.set_gpu_scores([(host, gpu, 0.8), ("nowhere", "gpu0", 0.1)]) == 2
    assert {reg.score(i.id) for i in insts} == {0.8}
    assert reg.set_gpu_scores([(host, gpu, 0.8)]) == 0  # unchanged: nothing moves
    for bad in (1.5, math.nan, -0.1, True):
        with pytest.raises(RegistryError, match=rf"GPU `{host}/{gpu}`: score must be a number in \[0, 1\]"):
            reg.set_gpu_scores([(host, gpu, 0.1), (host, gpu, bad)])
    assert {reg.score(i.id) for i in insts} == {0.8}  # a refused batch changed nothing


def test_a_score_push_leaves_keys_the_collector_can_untrack(policies_bundle: Bundle) -> None:
    """A pushed score's rank keys hold the group's own name, not the caller's equal copy (a
    new tuple per push): built of numbers and untracked strings only, the collector stops
    tracking them at its first pass, so a young collection after each tick's pushes does
    not walk one key per instance moved."""
    import gc

    rng = random.Random(3)
    fraud = admissible(policies_bundle, rng, "f0", model="fraud-scorer")
    host, gpu = fraud.deployment.host, fraud.deployment.gpu
    reg = Registry(policies_bundle, [copy(fraud, f"f{n}") for n in range(4)])
    gc.collect()  # the build's names untracked, as a settled serving heap's are
    assert reg.set_gpu_scores([(host, gpu, 0.6)]) == 1
    gc.collect()
    tiers = reg._tiers
    group = next(iter(tiers.groups.values()))
    assert group.key[1] is group.name
    for slot in group.slots:
        assert tiers.key_of[slot][1] is group.name
        assert not gc.is_tracked(tiers.key_of[slot])
    assert {reg.score(f"f{n}") for n in range(4)} == {0.6}


@SETTINGS
@given(seed=st.integers(0, 2**32), fleet=st.integers(0, 150), script=ops, reqs=st.lists(requests, min_size=1, max_size=4),
       hosts=st.integers(1, 3))
def test_dense_fleets_match_the_reference_scan(shapes_bundle: Bundle, seed: int, fleet: int, script: list, reqs: list,
                                                hosts: int) -> None:
    """On 1-3 hosts most instances have copies on their GPU: after every registry change,
    best-k (plain and distinct) equals the reference scan's order by (-score, group, id)."""
    rng = random.Random(seed)
    reg = Registry(shapes_bundle, shard_size=4)
    reg.add_many([admissible(shapes_bundle, rng, f"i{n:03d}", hosts=hosts) for n in range(fleet)],
                 {f"i{n:03d}": rng.choice((0.1, 0.5, 0.9)) for n in range(fleet) if rng.random() < 0.7})
    typed_reqs = [typed(shapes_bundle, raw) for raw in reqs]
    counter = fleet
    for op in [("score", 0, 0.5)] + script:
        ids = sorted(e[0].id for e in reg.entries())
        if op[0] == "add":
            counter += 1
            reg.add(admissible(shapes_bundle, random.Random(op[1]), f"i{counter:03d}", hosts=hosts),
                    score=None if op[1] % 2 else random.Random(op[1]).random())
        elif ids and op[0] == "remove":
            reg.remove(ids[op[1] % len(ids)])
        elif ids and op[0] == "update":
            reg.update(admissible(shapes_bundle, random.Random(op[2]), ids[op[1] % len(ids)], hosts=hosts))
        elif ids and op[0] == "score":
            reg.set_score(ids[op[1] % len(ids)], op[2])
        entries = [(inst, attributes(inst, shapes_bundle.contract(inst.model), shapes_bundle), score)
                   for inst, _, score in reg.entries()]
        groups: dict[tuple, set[float]] = {}
        for inst, _, score in entries:
            groups.setdefault((inst.model, inst.deployment.host, inst.deployment.gpu), set()).add(score)
        assert all(len(s) == 1 for s in groups.values())  # every copy carries its group's score
        for req in typed_reqs:
            for k in (1, 3, len(entries) + 1):
                want = naive_match(shapes_bundle, entries, req.vars, k)
                got = reg.match(req, k)
                assert got.count == len(want.ids) and tuple(s.instance.id for s in got.best) == want.best
            every = naive_match(shapes_bundle, entries, req.vars, len(entries) + 1).best
            seen: set[tuple] = set()
            distinct = []
            for iid in every:
                g = next((i.model, i.deployment.host, i.deployment.gpu) for i, _, _ in entries if i.id == iid)
                if g not in seen:
                    seen.add(g)
                    distinct.append(iid)
            assert tuple(s.instance.id for s in reg.match(req, 5, distinct_gpus=True).best) == tuple(distinct[:5])
