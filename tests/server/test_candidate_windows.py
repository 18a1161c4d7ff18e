"""A model's candidates are placed in windows: when the placer finds no room among the best
few (their GPUs' share is spent for this tick), the model's next candidates are tried before
the request is refused or handed to another model, and the decision says so."""

from __future__ import annotations

from server_rig import SMALL

from policyc.compiler.bundle import Bundle
from policyc.server.app import DecisionServer
from policyc.server.config import ServeConfig
from policyc.server.decision import DecisionInput, Outcome, Stage
from policyc.server.fleet import admissible_fleet

HEADERS = {"X-Tenant": "charite", "X-Data-Region": "eu-west"}


def test_the_next_window_is_placed_when_the_best_candidates_run_out_of_share(bundle: Bundle) -> None:
    server = DecisionServer(bundle, ServeConfig(cluster=SMALL, start_refresher=False, candidates=2))
    assert server.cluster is not None
    models = [c.name for c in bundle.contracts if c.name != "clinical-notes"]
    server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots(), models=models))
    eng = server.engine
    inp = DecisionInput(HEADERS, {})
    tries = eng._matched(eng.prepare(inp), None).tries
    first = {x.id for x in tries[0][2]}
    assert len(tries) > 2 and len(tries[0][2]) == 2 and tries[1][0] == f"{tries[0][0]} (candidates 3-4)"

    decisions = [eng.decide(inp) for _ in range(600)]  # one snapshot: reserved share only grows
    admitted = [d for d in decisions if d.outcome is Outcome.ADMITTED]
    beyond = [d for d in admitted if d.plan is not None and d.plan.instance_id not in first]
    assert beyond, "no decision reached past the first window"
    d = beyond[0]
    assert d.model == tries[0][1].name and len(d.notes) == 1
    assert d.notes[0].startswith(f"`{tries[0][0]}` was tried first: no feasible GPU")
    assert any(len(x.notes) == 2 and x.notes[1].startswith(f"`{tries[1][0]}` was tried first") for x in admitted)
    refused = [d for d in decisions if d.outcome is Outcome.REJECTED]
    assert refused, "600 decisions on one snapshot should spend every window's share"
    r = refused[0].rejection  # every window of every model ran out: the reason names each one tried
    assert r is not None and r.stage is Stage.PLACEMENT and refused[0].model == tries[0][1].name
    assert r.reason.count("no feasible GPU") == len(tries)
    assert all(f"`{label}`:" in r.reason for label, *_ in tries)
