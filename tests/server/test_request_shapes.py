"""The per-request-shape cache on Decide's path: a repeated shape gets the answer a fresh
parse would give, the matcher's answer is recomputed after any registry write, a reload
starts afresh, and bad input is never kept."""

from __future__ import annotations

import grpc
import pytest

from server_rig import SMALL, start

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.server.app import DecisionServer
from policyc.server.config import ServeConfig
from policyc.server.decision import DecisionInput, Stage
from policyc.server.fleet import admissible_fleet
from policyc.server.prepared import MatchMemo
from policyc.server.proto import pb, pb_grpc
from policyc.server.request_shapes import RequestShapes

HEADERS = {"X-Tenant": "charite", "X-Data-Region": "eu-west"}


@pytest.fixture()
def server(bundle: Bundle) -> DecisionServer:
    s = DecisionServer(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    assert s.cluster is not None
    models = [c.name for c in bundle.contracts if c.name != "clinical-notes"]  # so that asking for it is a matcher rejection
    s.engine.register_many(admissible_fleet(bundle, s.cluster.gpu_slots(), models=models))
    return s


def test_a_memoised_decision_equals_a_fresh_one(server: DecisionServer) -> None:
    eng = server.engine
    inp = DecisionInput(HEADERS, {})
    prep, memo = eng.prepare(inp), MatchMemo()
    first = eng.decide_prepared(prep, memo)
    assert memo.entry is not None
    kept = eng.decide_prepared(prep, memo, lookup=1e-6)
    fresh = eng.decide(inp)
    for d in (kept, fresh):
        assert (d.outcome, d.model, d.rules, d.candidates, d.variables, d.region) == \
            (first.outcome, first.model, first.rules, first.candidates, first.variables, first.region)
    assert kept.timing.parse == 1e-6 and kept.timing.feasibility == 0.0  # a cache hit reports the lookup
    assert kept.decision_id != first.decision_id


def test_the_match_memo_is_recomputed_after_registry_writes_and_score_pushes(server: DecisionServer) -> None:
    eng = server.engine
    prep, memo = eng.prepare(DecisionInput(HEADERS, {})), MatchMemo()
    before = eng.decide_prepared(prep, memo)
    kept = memo.entry
    assert eng.decide_prepared(prep, memo).candidates == before.candidates and memo.entry is kept
    victim = before.plan.instance_id
    eng.deregister(victim)
    after = eng.decide_prepared(prep, memo)
    assert memo.entry is not kept and after.candidates == before.candidates - 1
    assert all(victim not in [i.id for i in t[2]] for t in memo.entry.tries)
    kept = memo.entry
    pushed = eng.push_scores([(i.deployment.host, i.deployment.gpu, 0.0) for i in kept.tries[0][2][:1]])
    assert pushed >= 1
    eng.decide_prepared(prep, memo)
    assert memo.entry is kept  # scores moved, but the ranking may trail them by up to `score_lag`
    eng.score_lag = 0.0
    eng.decide_prepared(prep, memo)
    assert memo.entry is not kept  # older than that: the ranking is asked again
    again = memo.entry
    eng.decide_prepared(prep, memo)
    assert memo.entry is again  # and kept while no score moves


def test_the_shape_table_belongs_to_one_state_and_is_bounded(server: DecisionServer, bundle: Bundle) -> None:
    eng = server.engine
    shapes = RequestShapes(max_shapes=2)
    st = eng.state
    raws = [pb.DecideRequest(headers={"X-Model": m}).SerializeToString() for m in ("fraud-scorer", "recommender", "fraud-scorer-lite")]
    for raw in raws[:2]:
        shapes.put(raw, eng.prepare(DecisionInput({"X-Model": "fraud-scorer"}, {}), st))
    assert len(shapes) == 2 and shapes.get(st, raws[0]) is not None
    shapes.put(raws[2], eng.prepare(DecisionInput({}, {}), st))
    assert len(shapes) == 2 and shapes.get(st, raws[1]) is None  # full: the least recently used went
    assert shapes.get(st, raws[0]) is not None and shapes.get(st, raws[2]) is not None
    eng.reload(bundle)
    assert shapes.get(eng.state, raws[2]) is None  # a reload's new state never sees the old entries
    with pytest.raises(ValueError, match="at least 1"):
        RequestShapes(max_shapes=0)


def test_repeated_requests_over_grpc_hit_the_cache_and_bad_ones_are_never_kept(bundle: Bundle) -> None:
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        svc = th.server.service
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            req = pb.DecideRequest(headers=HEADERS)
            ds = [stub.Decide(req) for _ in range(5)]
            assert {d.outcome for d in ds} == {pb.ADMITTED} and len({d.decision_id for d in ds}) == 5
            assert svc.shapes.distinct() == 1  # (kept under the client's bytes and the canonical ones)
            assert all(d.timing.feasibility_us == 0 for d in ds[1:]) and ds[0].timing.parse_us > 0
            for _ in range(2):
                with pytest.raises(grpc.RpcError) as e:
                    stub.Decide(pb.DecideRequest(headers={"X-SLO-Latency": "fast"}))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert svc.shapes.distinct() == 1  # (kept under the client's bytes and the canonical ones)
            garbage = ch.unary_unary("/policyc.decision.v1.Decisions/Decide")
            with pytest.raises(grpc.RpcError) as e:
                garbage(b"\xff\xff\xff")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a valid DecideRequest" in e.value.details()
    finally:
        th.stop()


def test_a_response_from_a_kept_head_parses_to_the_full_message(server: DecisionServer) -> None:
    from policyc.server import convert
    from policyc.server.request_shapes import ShapeEntry

    eng = server.engine
    cases = [HEADERS, {"X-Tenant": "st-marys", "X-Data-Region": "us-east"},  # admitted; solver rejection
             {"X-Tenant": "charite", "X-Model": "clinical-notes", "X-Retry-Count": "2"},  # matcher rejection
             {"X-Model": "recommender"}]  # placer rejection, with the HTTP dependency made too slow below
    cluster = server.cluster
    assert cluster is not None
    for region in cluster.topology().ingress:
        cluster.service_p99(f"http-{region}", 0.5, ticks=1)
    server.refresher.tick()
    outcomes = set()
    for h in cases:
        entry = ShapeEntry(eng.prepare(DecisionInput(h, {})))
        for _ in range(3):
            d = eng.decide_prepared(entry.prepared, entry.memo, 1e-6)
            outcomes.add((d.outcome, d.rejection.stage if d.rejection else None))
            assert pb.Decision.FromString(entry.response(d)) == convert.decision(d)
        assert entry.head is not None
    assert {stage for _, stage in outcomes} == {None, Stage.FEASIBILITY, Stage.MATCH, Stage.PLACEMENT}


def test_requests_of_one_reduced_shape_share_the_ranked_answer(server: DecisionServer,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two SLOs between the same thresholds are one reduced shape: the matcher ranks once
    for both (each keeps its own latency budget), an answer equal to ranking afresh; another
    region is another shape; a registry write ranks again."""
    eng = server.engine
    reg = eng.state.registry
    ranked: list[object] = []
    real = reg.match
    monkeypatch.setattr(reg, "match", lambda *a, **k: (ranked.append(a[0]), real(*a, **k))[1])
    a, b = (eng.prepare(DecisionInput({"X-SLO-Latency": slo, "X-Data-Region": "us-west"}, {})) for slo in ("150.25ms", "150.75ms"))
    assert reg.index.shape_key(a.request.vars)[0] == reg.index.shape_key(b.request.vars)[0]  # the same reduced shape
    ma, mb = MatchMemo(), MatchMemo()
    da, db = eng.decide_prepared(a, ma), eng.decide_prepared(b, mb)
    assert len(ranked) == 1 and ma.entry is not None and mb.entry is not None and ma.entry.result is mb.entry.result
    for prep, memo in ((a, ma), (b, mb)):  # each request's own budget (the engine's rule for it)
        assert memo.entry is not None
        assert [t[3] for t in memo.entry.tries] == [eng._budget(t[1], prep.request.vars) for t in memo.entry.tries]
    assert da.candidates == db.candidates and da.outcome == db.outcome
    eng._ranked_shapes.clear()  # ranked afresh: the same answer
    fresh = MatchMemo()
    eng.decide_prepared(b, fresh)
    assert len(ranked) == 2 and fresh.entry is not None
    assert [[i.id for i in t[2]] for t in fresh.entry.tries] == [[i.id for i in t[2]] for t in mb.entry.tries]
    eng.decide_prepared(eng.prepare(DecisionInput({"X-SLO-Latency": "150.25ms", "X-Data-Region": "eu-west"}, {})), MatchMemo())
    assert len(ranked) == 3  # another region: another shape
    eng.deregister(da.plan.instance_id if da.plan is not None else next(iter(reg.entries()))[0].id)
    again = MatchMemo()
    eng.decide_prepared(a, again)
    assert len(ranked) == 4 and again.entry is not None and again.entry.result.count == ma.entry.result.count - 1


def test_the_same_request_in_another_byte_order_finds_its_shape(bundle: Bundle) -> None:
    """Protobuf leaves a map's entry order to the writer (another client process writes the
    headers in its own order): both orders of one request, over Decide and DecideBatch,
    share one shape entry, prepared once and kept under both byte strings."""
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    try:
        svc = th.server.service
        parts = [pb.DecideRequest(headers={k: v}).SerializeToString() for k, v in
                 {"X-Tenant": "charite", "X-Data-Region": "eu-west", "X-SLO-Latency": "180ms"}.items()]
        orders = [b"".join(parts), b"".join(reversed(parts)), parts[1] + parts[0] + parts[2]]
        assert len(set(orders)) == 3 and len({pb.DecideRequest.FromString(o).SerializeToString(deterministic=True)
                                              for o in orders}) == 1
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            decide = ch.unary_unary("/policyc.decision.v1.Decisions/Decide")
            batch = ch.unary_unary("/policyc.decision.v1.Decisions/DecideBatch")
            first = pb.Decision.FromString(decide(orders[0]))
            second = pb.Decision.FromString(decide(orders[1]))
            answered = pb.DecideBatchResponse.FromString(batch(b"".join(b"\x0a" + bytes((len(o),)) + o for o in orders)))
        assert first.outcome == second.outcome == pb.ADMITTED and first.model == second.model
        assert second.timing.feasibility_us == 0  # no preparation: the shape's entry was found
        assert [d.model for d in answered.decisions] == [first.model] * 3
        st = th.server.engine.state
        entries = {id(svc.shapes.get(st, o)) for o in orders}
        assert len(entries) == 1 and None not in {svc.shapes.get(st, o) for o in orders} and svc.shapes.distinct() == 1
        th.call(svc.reload(bundle, source="test"))  # re-prepared once, still shared by every byte order
        st = th.server.engine.state
        kept = {svc.shapes.get(st, o) for o in orders}
        assert len(kept) == 1 and None not in kept and svc.shapes.distinct() == 1
    finally:
        th.stop()
