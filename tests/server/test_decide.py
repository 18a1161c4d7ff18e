"""Decide and Explain over real gRPC: admissions with placement and rule spans, the three
kinds of rejection (solver, matcher, placer), and the account Explain gives."""

from __future__ import annotations

from policyc.server import convert
from policyc.server.proto import pb


def test_reference_request_is_admitted_with_instance_placement_rules_and_latency(stub, served) -> None:
    d = stub.Decide(pb.DecideRequest(headers={"X-SLO-Latency": "150ms", "X-Data-Region": "us-west"}))
    assert d.outcome == pb.ADMITTED
    p = d.placement
    inst = served.server.state.registry.get(p.instance_id)
    assert inst.deployment.region == "us-west" and p.region == "us-west"
    assert f"{p.host}/{p.gpu}" == f"{inst.deployment.host}/{inst.deployment.gpu}"
    assert 0 < p.share <= 1 and p.predicted.total_ms > 0
    assert abs(p.predicted.total_ms - (p.predicted.network_ms + p.predicted.queueing_ms + p.predicted.compute_ms
                                       + p.predicted.dependencies_ms)) < 1e-6
    ids = {r.id: r.origin for r in d.rules}
    assert set(ids) >= {"routing.latency-target", "routing.data-region"}
    assert ids["routing.data-region"].file == "policies/routing.contract" and ids["routing.data-region"].line == 15
    assert d.bundle_hash == served.server.state.bundle_hash
    assert len(d.decision_id) == 32 and d.timing.total_us > 0 and d.candidates > 0
    assert d.variables["region"] == "us-west" and d.variables["slo"] == "0.15"


def test_finance_request_lands_on_attested_hardware(stub, served) -> None:
    d = stub.Decide(pb.DecideRequest(headers={"X-Tenant": "acme-bank", "X-SLO-Latency": "200ms"}))
    assert d.outcome == pb.ADMITTED
    dep = served.server.state.registry.get(d.placement.instance_id).deployment
    assert dep.tpm and dep.memory_encryption and dep.hardware_firewall
    assert "compliance.finance-hardening" in [r.id for r in d.rules]


def test_decision_ids_are_unique(stub) -> None:
    req = pb.DecideRequest(headers={"X-Model": "fraud-scorer-lite"})
    assert len({stub.Decide(req).decision_id for _ in range(20)}) == 20


def test_region_mars_is_rejected_by_the_solver_with_the_declaring_span(stub) -> None:
    d = stub.Decide(pb.DecideRequest(attributes=convert.attributes_msg({"region": "mars-1"})))
    assert d.outcome == pb.REJECTED and d.rejection.stage == pb.FEASIBILITY
    assert "`mars-1` is not a declared value of `request.region`" in d.rejection.reason
    assert d.rejection.spans[0].file == "policies/requests.contract"
    assert d.candidates == 0 and d.timing.match_us == 0


def test_contradictory_rules_are_rejected_by_the_solver_naming_them(stub) -> None:
    d = stub.Decide(pb.DecideRequest(headers={"X-Tenant": "st-marys", "X-Data-Region": "us-east"}))
    assert d.outcome == pb.REJECTED and d.rejection.stage == pb.FEASIBILITY
    assert set(d.rejection.rule_ids) == {"routing.data-region", "compliance.healthcare-eu"}


def test_no_live_instance_is_a_matcher_rejection_with_per_predicate_elimination(stub, served) -> None:
    # clinical-notes is declared (the solver admits the request) but none is registered here
    d = stub.Decide(pb.DecideRequest(headers={"X-Tenant": "charite", "X-Model": "clinical-notes"}))
    assert d.outcome == pb.REJECTED and d.rejection.stage == pb.MATCH
    live = len(served.server.state.registry)
    pinned = next(e for e in d.rejection.eliminations if e.id == "routing.pinned-model")
    assert pinned.eliminated == live
    assert pinned.predicates[0].predicate == "model == request.model" and pinned.predicates[0].failing == live
    assert "`routing.pinned-model` (policies/routing.contract:5:3) excludes" in d.rejection.reason


def test_recommender_binds_its_http_api_and_dedicated_cache(stub, served) -> None:
    d = stub.Decide(pb.DecideRequest(headers={"X-Model": "recommender"}))
    assert d.outcome == pb.ADMITTED and d.model == "recommender"
    deps = {b.service: b for b in d.placement.dependencies}
    assert deps["catalog-api"].endpoint == f"http-{d.placement.region}" and deps["catalog-api"].role == "direct"
    assert deps["catalog-api"].predicted_ms <= deps["catalog-api"].bound_ms == 30
    assert deps["session-cache"].role == "dedicated"


def test_support_chatbot_reads_its_state_from_the_nvme_on_its_numa_node(stub, served) -> None:
    d = stub.Decide(pb.DecideRequest(headers={"X-Model": "support-chatbot"}, session_id="conv-42"))
    assert d.outcome == pb.ADMITTED and d.model == "support-chatbot"
    p = d.placement
    (b,) = p.dependencies
    assert b.service == "conversation-store" and b.role == "local"
    assert b.endpoint == f"{p.host}/numa{p.numa_node}/nvme" and b.predicted_ms <= b.bound_ms == 4
    assert served.server.state.registry.get(p.instance_id).deployment.session_state == "nvme"


def test_placer_refusal_names_the_binding_constraint(stub, served) -> None:
    # every region's HTTP tier slows to 500 ms for one tick: the catalog-api bound (30 ms) binds
    cluster, refresher = served.server.cluster, served.server.refresher
    for region in cluster.topology().ingress:
        cluster.service_p99(f"http-{region}", 0.5, ticks=1)
    refresher.tick()
    try:
        d = stub.Decide(pb.DecideRequest(headers={"X-Model": "recommender"}))
    finally:
        refresher.tick()  # the pin expires
    assert d.outcome == pb.REJECTED and d.rejection.stage == pb.PLACEMENT
    assert d.rejection.binding_constraint == "dependency" and "catalog-api" in d.rejection.reason
    assert d.rejection.gpus and all(g.constraint == "dependency" for g in d.rejection.gpus)
    assert stub.Decide(pb.DecideRequest(headers={"X-Model": "recommender"})).outcome == pb.ADMITTED


def test_explain_gives_the_full_account(stub) -> None:
    e = stub.Explain(pb.DecideRequest(headers={"X-Tenant": "acme-bank", "X-Data-Region": "us-west"}))
    assert e.decision.outcome == pb.ADMITTED
    assert e.feasibility.startswith("feasible") and e.matching > 0 and e.live_instances >= e.matching
    rules = {r.id: r for r in e.rules}
    fin = rules["compliance.finance-hardening"]
    assert fin.applied and fin.eliminated > 0
    assert {p.predicate for p in fin.predicates} == {"tpm == yes", "memory_encryption == yes", "hardware_firewall == yes"}
    assert not rules["compliance.healthcare-eu"].applied and rules["compliance.healthcare-eu"].why == "guard is false"
    assert e.decision.placement.reasons and e.decision.placement.reasons[0].startswith("chose ")
    text = "\n".join(e.narrative)
    assert "solver: feasible" in text and "placer: chose" in text and "admitted: fraud-scorer" in text


def test_retry_header_is_the_guardians_not_the_policys(stub) -> None:
    d = stub.Decide(pb.DecideRequest(headers={"X-Tenant": "acme-bank", "X-Model": "fraud-scorer-lite", "X-Retry-Count": "1"}))
    assert d.outcome == pb.ADMITTED and d.retry_count == 1


def test_decisions_are_audited_and_metrics_count_them(stub, served) -> None:
    before = served.server.metrics.text().decode()
    stub.Decide(pb.DecideRequest(headers={"X-Model": "fraud-scorer-lite"}))
    text = served.server.metrics.text().decode()
    assert 'policyc_decisions_total{outcome="admitted",reason="ok"}' in text and text != before
    assert "policyc_decision_seconds_bucket" in text and "policyc_registry_instances" in text
    assert "policyc_topology_staleness_seconds" in text
    assert served.server.audit is not None and served.server.audit.failures == 0
