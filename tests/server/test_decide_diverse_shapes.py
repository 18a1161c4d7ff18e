"""Decide under a diverse header mix (random SLOs, region on 60 %, tenant on 70 %, a pinned
model on 30 %, as a real gateway's traffic): no Z3 call ever runs on the serving loop (the
solver's counter says so, and so does the metric), new infeasible shapes are still refused
at the feasibility stage, the shape table never starts over, and a reload swaps in a warm
table and a warm solver cache."""

from __future__ import annotations

import random

import grpc

from server_rig import SMALL, start

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.server.config import ServeConfig
from policyc.server.decision import DecisionInput
from policyc.server.proto import pb, pb_grpc
from policyc.server.request_input import to_request
from policyc.server.request_shapes import RequestShapes

REGIONS = ("us-west", "us-east", "eu-west", "eu-central")
TENANTS = ("acme-bank", "first-federal", "st-marys", "charite", "shopwave")
MODELS = ("fraud-scorer", "fraud-scorer-lite", "recommender", "support-chatbot", "clinical-notes")


def diverse(rng: random.Random) -> dict[str, str]:
    h = {"X-SLO-Latency": f"{rng.uniform(1, 500):.2f}ms"}
    if rng.random() < 0.6:
        h["X-Data-Region"] = rng.choice(REGIONS)
    if rng.random() < 0.7:
        h["X-Tenant"] = rng.choice(TENANTS)
    if rng.random() < 0.3:
        h["X-Model"] = rng.choice(MODELS)
    return h


def test_no_solver_on_the_loop_and_a_warm_reload(bundle: Bundle) -> None:
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        svc = th.server.service
        svc.shapes = RequestShapes(max_shapes=64)  # small, so the mix overflows it many times
        rng = random.Random(25)
        stages = {}
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for _ in range(160):
                d = stub.Decide(pb.DecideRequest(headers=diverse(rng)), timeout=30)
                stages[d.rejection.stage if d.HasField("rejection") else "admitted"] = 1
            # a healthcare tenant pinned to a US region can never be served: the solver says so
            infeasible = stub.Decide(pb.DecideRequest(headers={"X-Tenant": "st-marys", "X-Data-Region": "us-east",
                                                                "X-SLO-Latency": "123.45ms"}), timeout=30)
            assert infeasible.outcome == pb.REJECTED and infeasible.rejection.stage == pb.FEASIBILITY
            feas = th.server.engine.state.feasibility
            # Explain of shapes the solver has not seen (new SLOs): solved in the solver
            # thread too, with the same account an inline check gives
            background = feas.solves_background
            st = th.server.engine.state
            new_shapes = ({"X-Tenant": "st-marys", "X-Data-Region": "us-east", "X-SLO-Latency": "950ms"},
                          {"X-Tenant": "acme-bank", "X-Data-Region": "us-west", "X-Model": "fraud-scorer",
                           "X-SLO-Latency": "900ms"})
            for h in new_shapes:
                assert feas.cached(to_request(st.registry, st.bundle, DecisionInput(h, {}))[0].vars) is None  # unseen
            healthcare, finance = (stub.Explain(pb.DecideRequest(headers=h), timeout=30) for h in new_shapes)
            assert healthcare.decision.rejection.stage == pb.FEASIBILITY and "feasible" not in healthcare.feasibility
            assert finance.decision.outcome == pb.ADMITTED and finance.matching > 0 and finance.narrative
            assert finance.feasibility.startswith("feasible")
            assert feas.solves_background >= background + 2  # both new shapes were solved in the solver thread
            counts = svc.feasibility_series.counts()
            assert counts["loop"] == 0 and feas.solves_on_loop == 0
            assert counts["inline"] + counts["background"] > 0  # Z3 did run: in worker threads
            text = th.server.metrics.text().decode()
            assert 'policyc_feasibility_solves_total{where="loop"} 0.0' in text
            assert len(svc.shapes) == 64  # full, and never started over
            seen = len(feas.seen())
            kept = len(svc.shapes)
            th.call(svc.reload(bundle, source="test"))
            new = th.server.engine.state.feasibility
            assert new is not feas and len(new.seen()) >= seen  # every shape solved before the swap
            assert len(svc.shapes) == kept and svc.shapes.get(th.server.engine.state, next(iter(svc.shapes._table))) is not None
            again = stub.Decide(pb.DecideRequest(headers={"X-Tenant": "st-marys", "X-Data-Region": "us-east",
                                                           "X-SLO-Latency": "123.45ms"}), timeout=30)
            assert again.rejection.stage == pb.FEASIBILITY and again.timing.feasibility_us == 0  # warm
            assert new.solves_on_loop == 0 and svc.feasibility_series.counts()["loop"] == 0
    finally:
        th.stop()


def test_decide_batch_answers_as_decide_does(bundle: Bundle) -> None:
    """A batch of the diverse mix: one decision per request, in order, each what the unary
    call answers for it (ids and timings apart); malformed batches and bad requests are
    refused naming the place."""
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        rng = random.Random(7)
        reqs = [pb.DecideRequest(headers=diverse(rng)) for _ in range(40)]
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            batch = stub.DecideBatch(pb.DecideBatchRequest(requests=reqs), timeout=30)
            assert len(batch.decisions) == len(reqs)
            for r, got in zip(reqs, batch.decisions):
                one = stub.Decide(r, timeout=30)
                assert (got.outcome, got.model, got.candidates, got.rejection.stage, got.rejection.reason) == \
                       (one.outcome, one.model, one.candidates, one.rejection.stage, one.rejection.reason)
                assert got.decision_id != one.decision_id
            assert stub.DecideBatch(pb.DecideBatchRequest(), timeout=30).decisions == []
            bad = [pb.DecideRequest(headers=diverse(rng)) for _ in range(3)] + [pb.DecideRequest(headers={"X-SLO-Latency": "soon"})]
            decided = sum(th.server.metrics.decisions.totals().values())
            try:
                stub.DecideBatch(pb.DecideBatchRequest(requests=bad), timeout=30)
                raise AssertionError("a malformed header was accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("request 3:")
            assert sum(th.server.metrics.decisions.totals().values()) == decided  # refused before any decision was made
            feas = th.server.engine.state.feasibility
            assert feas.solves_on_loop == 0 and feas.solves_background > 0  # the batch's new shapes: the solver thread
            raw = ch.unary_unary("/policyc.decision.v1.Decisions/DecideBatch")
            try:
                raw(b"\x12\x00", timeout=30)
                raise AssertionError("a field other than `requests` was accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "field 1" in e.details()
    finally:
        th.stop()


def test_match_all_lists_what_the_index_admits(bundle: Bundle) -> None:
    """MatchAll: the count and ids `Registry.matches` gives (every one also admitted by the
    naive scan), `limit` caps the ids and never the count; bad headers are refused."""
    from policyc.matcher import attributes, naive_match

    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        reg = th.server.engine.state.registry
        entries = [(i, attributes(i, bundle.contract(i.model), bundle), s) for i, _, s in reg.entries()]
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for h in ({"X-Tenant": "charite", "X-Data-Region": "eu-west"}, {"X-SLO-Latency": "150ms"}, {}):
                r = stub.MatchAll(pb.MatchAllRequest(request=pb.DecideRequest(headers=h)), timeout=30)
                want = naive_match(bundle, entries, reg.parse_request(h).vars, 1)
                assert r.count == len(want.ids) == len(r.instance_ids) and set(r.instance_ids) == want.ids
                assert [x.id for x in r.rules] == list(want.rules) and r.bundle_hash == bundle.content_hash
            few = stub.MatchAll(pb.MatchAllRequest(request=pb.DecideRequest(headers={}), limit=3), timeout=30)
            assert len(few.instance_ids) == 3 and few.count == len(entries)
            try:
                stub.MatchAll(pb.MatchAllRequest(request=pb.DecideRequest(headers={"X-SLO-Latency": "soon"})), timeout=30)
                raise AssertionError("a malformed header was accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "X-SLO-Latency" in e.details()
    finally:
        th.stop()
