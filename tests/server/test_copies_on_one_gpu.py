"""Copies of a model on one GPU (several model servers sharing one accelerator, each its own
engine) are one placement choice: a gateway's requests go to one copy, whose batch the others
would otherwise time-slice the device against, and the next copy serves when it leaves.
(Measured on 2 real vLLM sharing one core: benchmarks/RESULTS.md, "two engines on one core".)"""

from __future__ import annotations

from server_rig import SMALL

from policyc.compiler.bundle import Bundle
from policyc.server.app import DecisionServer
from policyc.server.config import ServeConfig
from policyc.server.decision import DecisionInput, Outcome
from policyc.server.fleet import admissible_fleet

HEADERS = {"X-Tenant": "charite", "X-Data-Region": "eu-west"}


def test_a_gateways_requests_go_to_one_copy_on_a_gpu_and_the_next_serves_when_it_leaves(bundle: Bundle) -> None:
    server = DecisionServer(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    assert server.cluster is not None
    eng = server.engine
    fleet = admissible_fleet(bundle, server.cluster.gpu_slots(), models=[c.name for c in bundle.contracts])
    eng.register_many(fleet)  # placement only: no endpoint, no gateway traffic
    inp = DecisionInput(HEADERS, {}, routable_only=True)
    one = eng.decide(DecisionInput(HEADERS, {}))  # the model and GPU these headers place on, from the whole fleet
    assert one.outcome is Outcome.ADMITTED and one.plan is not None
    base = next(i for i in fleet if i.id == one.plan.instance_id)
    copies = [base.model_copy(update={"id": f"{base.id}#{n}", "deployment": base.deployment.model_copy(
        update={"endpoint": f"127.0.0.1:{8001 + n}"})}) for n in (2, 1, 3)]  # registered out of id order
    eng.register_many(copies)

    def served() -> set[str]:  # the endpoints of the admitted (one snapshot: the GPU's share runs out after a few)
        server.refresher.tick()
        got = [eng.decide(inp) for _ in range(8)]
        assert got[0].outcome is Outcome.ADMITTED, got[0].rejection
        return {d.endpoint for d in got if d.outcome is Outcome.ADMITTED}

    assert served() == {"127.0.0.1:8002"}  # the first copy by id, every time: one engine's batch
    eng.deregister(f"{base.id}#1")
    assert served() == {"127.0.0.1:8003"}  # the next copy serves
