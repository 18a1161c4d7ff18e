"""Decide's response written as wire bytes (`decision_wire`) parses to the message protobuf
builds (`convert.decision`): on the engine's own decisions over the diverse header mix
(admissions and rejections) and on plans
carrying every optional part (a session move, a stale snapshot, dependencies, an
endpoint, a NUMA node, non-ASCII text); a shape entry's kept rejection is the one its
decision has."""

from __future__ import annotations

import random
from dataclasses import replace

from server_rig import SMALL, start
from test_decide_diverse_shapes import diverse

from policyc.compiler.bundle import Bundle
from policyc.placer.plan import SessionMove
from policyc.server import convert, decision_wire
from policyc.server.config import ServeConfig
from policyc.server.decision import Decision, DecisionInput, Rejection, Stage
from policyc.server.proto import pb
from policyc.server.request_shapes import ShapeEntry


def _wire(d: Decision) -> pb.Decision:
    rejection = convert.rejection_field(d.rejection) if d.rejection is not None else b""
    return pb.Decision.FromString(convert.decision_head(d) + decision_wire.tail(d, rejection))


def test_wire_bytes_parse_to_the_protobuf_message(bundle: Bundle) -> None:
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        eng = th.server.engine
        rng = random.Random(11)
        seen: dict[str, int] = {}
        plans = []
        for _ in range(150):
            d = eng.decide(DecisionInput(diverse(rng), {}))
            kind = "admitted" if d.plan is not None else d.rejection.stage.value  # type: ignore[union-attr]
            seen[kind] = seen.get(kind, 0) + 1
            assert _wire(d) == convert.decision(d), d
            if d.plan is not None:
                plans.append(d)
        assert seen.get("admitted") and seen.get("feasibility")  # both kinds were written
        # every optional part of a placement, and text that is not ASCII
        d = next(x for x in plans if x.plan is not None and x.plan.dependencies)
        p = d.plan
        assert p is not None
        full = replace(p, stale=True, numa_node=1, queue_depth=0, rdma_port=None, snapshot_version=0,
                       session_move=SessionMove("s-1", "host-1/gpu0", "host-2/gpu3", "numa déplacé"))
        variants = [replace(d, plan=full, notes=("`a` was tried first: no GPU — full",), endpoint="10.0.0.7:9000",
                            region="eu-west", model="fraud-scorer"),
                    replace(d, plan=replace(p, probes=(), dependencies=()), region=None, endpoint="")]
        for v in variants:
            assert _wire(v) == convert.decision(v)
        # rejections of each stage, with GPU rejections and matcher eliminations
        gpu_rej = p.rejected or ()
        for r in (Rejection(Stage.PLACEMENT, "no GPU had share: é", binding="gpu_share", gpus=gpu_rej),
                  Rejection(Stage.MATCH, "none", ("r1", "r2")), Rejection(Stage.FEASIBILITY, "", ())):
            v = replace(d, plan=None, rejection=r, model=None)
            assert _wire(v) == convert.decision(v)
    finally:
        th.stop()


def test_a_shape_keeps_its_rejection_only_while_it_repeats(bundle: Bundle) -> None:
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        eng = th.server.engine
        infeasible = DecisionInput({"X-Tenant": "st-marys", "X-Data-Region": "us-east"}, {})
        entry = ShapeEntry(eng.prepare(infeasible))
        first, again = (eng.decide_prepared(entry.prepared, entry.memo) for _ in range(2))
        assert first.rejection is again.rejection  # the shape's memo keeps the solver's rejection
        unkept = eng.decide_prepared(entry.prepared)  # without the memo: made afresh, the same parts
        assert unkept.rejection is not first.rejection and unkept.rejection == first.rejection
        one, two = (pb.Decision.FromString(entry.response(x)) for x in (first, again))
        assert entry.rejection is not None and entry.rejection[0] is first.rejection  # kept from the first
        assert one == convert.decision(first) and two == convert.decision(again)
        other = replace(again, rejection=Rejection(Stage.FEASIBILITY, "another reason", ()))
        assert pb.Decision.FromString(entry.response(other)).rejection.reason == "another reason"
    finally:
        th.stop()


def test_a_plans_dependency_bytes_are_kept_by_the_identity_of_its_bindings(bundle: Bundle) -> None:
    """The placer hands every plan on one candidate within a tick the same bindings tuple,
    so their bytes are written once per tuple; another tuple (equal or not, as a new tick's
    bindings are) is written afresh, and every answer parses to protobuf's message."""
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        eng = th.server.engine
        rng = random.Random(3)
        d = next(x for x in (eng.decide(DecisionInput(diverse(rng), {})) for _ in range(300))
                 if x.plan is not None and x.plan.dependencies)
        p = d.plan
        assert p is not None
        assert _wire(d) == convert.decision(d)
        kept = decision_wire._dependencies[id(p.dependencies)]
        assert kept[0] is p.dependencies and kept[1] == decision_wire.dependency_fields(p.dependencies)
        assert _wire(d) == convert.decision(d) and decision_wire._dependencies[id(p.dependencies)] is kept  # read again
        moved = tuple(replace(b, predicted=b.predicted + 1e-3) for b in p.dependencies)  # a later tick's figures
        v = replace(d, plan=replace(p, dependencies=moved))
        got = _wire(v)
        assert got == convert.decision(v) and got != convert.decision(d)
        assert [x.predicted_ms for x in got.placement.dependencies] == [b.predicted * 1e3 for b in moved]
        same = replace(d, plan=replace(p, dependencies=tuple(p.dependencies[i] for i in range(len(p.dependencies)))))
        assert _wire(same) == convert.decision(d)  # an equal tuple, another object
    finally:
        th.stop()
