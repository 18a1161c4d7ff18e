"""The decision API's own scenes (`Decide`, `Explain` over gRPC), as a user who runs
`policyc serve` without a gateway sees them: full decisions with their placement, the
binding of declared dependencies, session state moves, a typed request the solver
rejects before any index scan, and a GPU whose SM utilisation collapses, healed in dry
run."""

from __future__ import annotations

import time

import grpc

from policyc.server import convert
from policyc.server.app import DecisionServer
from policyc.server.proto import pb, pb_grpc
from policyc.server.render import decision_text, explanation_text

from .narration import DemoError, Narrator


def decide(say: Narrator, stub: pb_grpc.DecisionsStub, title: str, headers: dict[str, str] | None = None,
           attributes: dict[str, object] | None = None, session: str = "") -> "pb.Decision | None":
    say.say()
    shown = ", ".join(f"{k}: {v}" for k, v in (headers or {}).items())
    if attributes:
        shown += (", " if shown else "") + ", ".join(f"{k}={v} (typed)" for k, v in attributes.items())
    if session:
        shown += (", " if shown else "") + f"session {session}"
    say.say(f"▶ {title}  [{shown}]")
    try:
        d = stub.Decide(pb.DecideRequest(headers=headers or {}, attributes=convert.attributes_msg(attributes or {}),  # type: ignore[arg-type]
                                         session_id=session))
    except grpc.RpcError as e:
        say.say(f"{e.code().name}  {e.details()}")
        return None
    say.say(decision_text(d))
    return d


def decide_mix(say: Narrator, stub: pb_grpc.DecisionsStub) -> None:
    decide(say, stub, "the reference request", {"X-SLO-Latency": "150ms", "X-Data-Region": "us-west"})
    decide(say, stub, "the recommender: its declared catalog API bound to the region's HTTP tier",
           {"X-Model": "recommender", "X-Data-Region": "us-west"})
    decide(say, stub, "a support-chatbot session: state read from the NVMe on the GPU's NUMA node",
           {"X-Model": "support-chatbot"}, session="conv-7")
    decide(say, stub, "clinical notes pinned to eu-central, the other EU region",
           {"X-Tenant": "charite", "X-Model": "clinical-notes", "X-Data-Region": "eu-central"})
    decide(say, stub, "region mars-1: the solver rejects it before any index scan", {"X-Tenant": "shopwave"},
           {"region": "mars-1"})


RETAIL = {"X-Tenant": "shopwave", "X-Model": "fraud-scorer-lite", "X-Data-Region": "us-east"}


def self_heal(say: Narrator, stub: pb_grpc.DecisionsStub, server: DecisionServer, headers: dict[str, str] = RETAIL,
              title: str = "a retail scoring request") -> None:
    assert server.cluster is not None and server.actions is not None
    d = decide(say, stub, title, headers)
    if d is None or d.outcome != pb.ADMITTED:
        raise DemoError(f"{title}: not admitted")
    gpu = f"{d.placement.host}/{d.placement.gpu}"
    started = time.time()
    server.cluster.sm_collapse(gpu, 0.15)
    say.say(f"\n  event: {gpu} SM utilisation pinned at 15 % while work piles up")
    watch = server.gpu_watch
    for _ in range(12):
        server.refresher.tick()
        if any(k == gpu and "sm-collapse" in v.fired for k, v in watch.fired):
            break
    if not any(k == gpu and "sm-collapse" in v.fired for k, v in watch.fired):
        raise DemoError("sm-collapse did not fire after 10 consecutive anomalies")
    for a in server.actions.memory.records:
        if a.kind.value in ("self_heal_step", "report_anomaly") and a.time >= started - 0.01 and gpu in a.target:
            say.say(f"  action: {a.kind.value:<15} {a.target:<28} {a.outcome.value:<8} {a.detail}")
    after = decide(say, stub, "the same request after the heal", headers)
    if after is not None and after.outcome == pb.ADMITTED:
        say.say(f"  placement now {after.placement.host}/{after.placement.gpu} (the collapsed GPU is avoided)")
    server.cluster.clear(gpu)


def explain(say: Narrator, stub: pb_grpc.DecisionsStub) -> None:
    e = stub.Explain(pb.DecideRequest(headers={"X-Tenant": "charite", "X-Data-Region": "eu-west"}))
    say.say(explanation_text(e))
