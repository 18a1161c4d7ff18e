"""Engine results ↔ protobuf messages. The one place that knows both shapes."""

from __future__ import annotations

import json
from typing import Mapping

from policyc.compiler.bundle import Scalar, SourceRef
from policyc.matcher import AppliedRule, Deployment, Instance, RuleExplanation
from policyc.placer import PlacementPlan
from policyc.placer.plan import Rejection as GpuRejection

from .decision import Account, Decision, DecisionInput, Outcome, Stage
from .errors import ServiceError, Status
from .proto import pb

_OUTCOME = {Outcome.ADMITTED: pb.ADMITTED, Outcome.REJECTED: pb.REJECTED}
_STAGE = {Stage.FEASIBILITY: pb.FEASIBILITY, Stage.MATCH: pb.MATCH, Stage.PLACEMENT: pb.PLACEMENT}


def decision_input(msg: "pb.DecideRequest") -> DecisionInput:
    attrs: dict[str, Scalar] = {}
    for k, v in msg.attributes.items():
        kind = v.WhichOneof("kind")
        if kind is None:
            raise ServiceError(Status.INVALID_ARGUMENT, f"attribute `{k}`: no value (set number, text or flag)")
        attrs[k] = getattr(v, kind)
    return DecisionInput(dict(msg.headers), attrs, msg.tenant or None, msg.session_id or None, msg.retry_count)


def value(x: Scalar) -> "pb.Value":
    if isinstance(x, bool):
        return pb.Value(flag=x)
    if isinstance(x, (int, float)):
        return pb.Value(number=float(x))
    return pb.Value(text=str(x))


def span(ref: SourceRef) -> "pb.SourceSpan":
    return pb.SourceSpan(file=ref.file, line=ref.line, col=ref.col)


def _gpu_rej(r: GpuRejection) -> "pb.GpuRejection":
    return pb.GpuRejection(gpu=r.gpu, constraint=r.constraint.value, detail=r.detail)


def rule_explanation(r: RuleExplanation) -> "pb.RuleExplanation":
    return pb.RuleExplanation(
        id=r.id, origin=span(r.origin), applied=r.applied, why=r.why, eliminated=r.eliminated,
        eliminated_in_order=r.eliminated_in_order,
        predicates=[pb.PredicateCount(predicate=p.predicate, origin=span(p.origin), failing=p.failing) for p in r.predicates],
    )


def placement(p: PlacementPlan, model: str | None, region: str | None, *, full: bool = True, notes: tuple[str, ...] = ()) -> "pb.Placement":
    """`full`: include the placer's reasons and per-GPU rejections (written lazily, so Decide's
    fast path leaves them to Explain)."""
    lat = p.latency
    msg = pb.Placement(
        instance_id=p.instance_id, model=model or "", host=p.host, gpu=p.gpu, gpu_model=p.gpu_model,
        numa_node=p.numa_node, rdma_port=p.rdma_port or "", queue_depth=p.queue_depth, share=p.share,
        share_source=p.share_source.value, region=region or "",
        predicted=pb.PredictedLatency(network_ms=lat.network * 1e3, queueing_ms=lat.queueing * 1e3,
                                      compute_ms=lat.compute * 1e3, dependencies_ms=lat.dependencies * 1e3,
                                      sigma_ms=lat.sigma * 1e3, total_ms=lat.total * 1e3),
        reasons=[*p.reasons, *notes] if full else list(notes), rejected=[_gpu_rej(r) for r in p.rejected] if full else [],
        dependencies=[pb.DependencyBinding(service=d.service, endpoint=d.endpoint, role=d.role,
                                           predicted_ms=d.predicted * 1e3, bound_ms=d.bound * 1e3) for d in p.dependencies],
        stale=p.stale, snapshot_version=max(p.snapshot_version, 0), probes=list(p.probes),
    )
    if p.session_move is not None:
        m = p.session_move
        msg.session_move.CopyFrom(pb.SessionMove(session=m.session, from_gpu=m.from_gpu, to_gpu=m.to_gpu, reason=m.reason))
    return msg


def render_var(x: Scalar) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


_RULES: dict[tuple[str, tuple[str, ...]], list["pb.MatchedRule"]] = {}
_RULES_MAX = 4096


def matched_rules(bundle_hash: str, rules: tuple[AppliedRule, ...]) -> list["pb.MatchedRule"]:
    """The `rules` field, built once per (bundle, set of applied rules): a request shape
    applies the same rules every time, and a rule's id names its span within a bundle.
    The messages are copied into each response by protobuf's C code."""
    key = (bundle_hash, tuple(r.id for r in rules))
    hit = _RULES.get(key)
    if hit is None:
        if len(_RULES) >= _RULES_MAX:
            _RULES.clear()
        hit = _RULES[key] = [pb.MatchedRule(id=r.id, origin=span(r.origin)) for r in rules]
    return hit


def decision(d: Decision, *, full: bool = False) -> "pb.Decision":
    t = d.timing
    msg = pb.Decision(
        decision_id=d.decision_id, outcome=_OUTCOME[d.outcome], bundle_hash=d.bundle_hash, model=d.model or "",
        rules=matched_rules(d.bundle_hash, d.rules), candidates=d.candidates,
        timing=pb.Timing(parse_us=t.parse * 1e6, feasibility_us=t.feasibility * 1e6, match_us=t.match * 1e6,
                         place_us=t.place * 1e6, total_us=t.total * 1e6),
        variables={k: render_var(v) for k, v in d.variables.items()}, retry_count=d.retry_count,
    )
    if d.plan is not None:
        msg.placement.CopyFrom(placement(d.plan, d.model, d.region, full=full, notes=d.notes))
    if d.rejection is not None:
        r = d.rejection
        msg.rejection.CopyFrom(pb.Rejection(
            stage=_STAGE[r.stage], reason=r.reason, rule_ids=list(r.rule_ids), spans=[span(s) for s in r.spans],
            eliminations=[rule_explanation(e) for e in r.eliminations], binding_constraint=r.binding,
            gpus=[_gpu_rej(g) for g in r.gpus]))
    return msg


def account(a: Account) -> "pb.Explanation":
    msg = pb.Explanation(decision=decision(a.decision, full=True), feasibility=a.feasibility, narrative=list(a.narrative))
    ex = a.explanation
    if ex is not None:
        msg.live_instances, msg.matching = ex.live, ex.count
        msg.rules.extend(rule_explanation(r) for r in ex.rules)
        msg.shards, msg.shards_skipped_by_bloom = ex.shards, ex.shards_skipped_by_bloom
    return msg


def instance(msg: "pb.RegisterInstanceRequest", model: str) -> Instance:
    if not msg.id:
        raise ServiceError(Status.INVALID_ARGUMENT, "instance `id` is required", field="id")
    if not msg.HasField("deployment"):
        raise ServiceError(Status.INVALID_ARGUMENT, f"instance `{msg.id}`: `deployment` is required", field="deployment")
    d = msg.deployment
    missing = [f for f in ("host", "gpu", "gpu_model", "region") if not getattr(d, f)]
    if missing:
        raise ServiceError(Status.INVALID_ARGUMENT, f"instance `{msg.id}`: deployment field `{missing[0]}` is required",
                           tuple(f"deployment.{m} is required" for m in missing), field=f"deployment.{missing[0]}")
    dep = Deployment(host=d.host, gpu=d.gpu, gpu_model=d.gpu_model, region=d.region, numa_node=d.numa_node, tpm=d.tpm,
                     memory_encryption=d.memory_encryption, hardware_firewall=d.hardware_firewall, tee=d.tee,
                     session_state=d.session_state or "remote", cuda=d.cuda or "12.4")
    return Instance(id=msg.id, model=model, deployment=dep, labels=dict(msg.labels))


def deployment_msg(d: Deployment) -> "pb.Deployment":
    return pb.Deployment(**d.model_dump())


def register_request(inst: Instance, *, contract_json: str | None = None, onnx_model: bytes | None = None,
                     score: float | None = None) -> "pb.RegisterInstanceRequest":
    """The request a client sends to register `inst` (used by the demo and tests)."""
    msg = pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=deployment_msg(inst.deployment),
                                     labels=inst.labels)
    if contract_json is not None:
        msg.contract_json = contract_json
    if onnx_model is not None:
        msg.onnx_model = onnx_model
    if score is not None:
        msg.score = score
    return msg


def attributes_msg(attrs: Mapping[str, Scalar]) -> dict[str, "pb.Value"]:
    return {k: value(v) for k, v in attrs.items()}


def dumps_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, indent=2)
