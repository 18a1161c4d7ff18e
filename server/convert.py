"""Engine results ↔ protobuf messages. The one place that knows both shapes."""

from __future__ import annotations

import re
from typing import Mapping

from google.protobuf.message import DecodeError

from policyc.compiler.bundle import Scalar, SourceRef
from policyc.compiler.check_values import version_key
from policyc.matcher import AppliedRule, Deployment, Instance, RuleExplanation
from policyc.matcher.instance import canonical_endpoint
from policyc.placer import PlacementPlan
from policyc.placer.plan import Rejection as GpuRejection

from . import decision_wire
from .decision import Account, Decision, DecisionInput, Outcome, Rejection, Stage
from .errors import ServiceError, Status
from .proto import pb

_OUTCOME = {Outcome.ADMITTED: pb.ADMITTED, Outcome.REJECTED: pb.REJECTED}
_STAGE = {Stage.FEASIBILITY: pb.FEASIBILITY, Stage.MATCH: pb.MATCH, Stage.PLACEMENT: pb.PLACEMENT}


def decide_request(raw: bytes) -> "pb.DecideRequest":
    """Parse a serialized DecideRequest; bytes that are not one are INVALID_ARGUMENT."""
    try:
        return pb.DecideRequest.FromString(raw)
    except DecodeError as e:
        raise ServiceError(Status.INVALID_ARGUMENT, f"the request is not a valid DecideRequest: {e}") from None


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


def placement(p: PlacementPlan, model: str | None, region: str | None, *, full: bool = True, notes: tuple[str, ...] = (),
              endpoint: str = "") -> "pb.Placement":
    """`full`: include the placer's reasons and per-GPU rejections (written lazily, so Decide's
    fast path leaves them to Explain)."""
    msg = pb.Placement()
    fill_placement(msg, p, model, region, full=full, notes=notes, endpoint=endpoint)
    return msg


def fill_placement(msg: "pb.Placement", p: PlacementPlan, model: str | None, region: str | None, *, full: bool,
                   notes: tuple[str, ...] = (), endpoint: str = "") -> None:
    """Write `p` into an empty `msg` in place (on Decide's path: setting the fields of the
    response's own sub-message avoids building a message and copying it in)."""
    lat = p.latency
    msg.instance_id, msg.model, msg.host, msg.gpu, msg.gpu_model = p.instance_id, model or "", p.host, p.gpu, p.gpu_model
    msg.numa_node, msg.queue_depth, msg.share, msg.share_source = p.numa_node, p.queue_depth, p.share, p.share_source.value
    msg.rdma_port, msg.region = p.rdma_port or "", region or ""
    if endpoint:
        msg.endpoint = endpoint
    msg.predicted.SetInParent()  # present even if every figure were 0, as a built sub-message would be
    pr = msg.predicted
    pr.network_ms, pr.queueing_ms, pr.compute_ms = lat.network * 1e3, lat.queueing * 1e3, lat.compute * 1e3
    pr.dependencies_ms, pr.sigma_ms, pr.total_ms = lat.dependencies * 1e3, lat.sigma * 1e3, lat.total * 1e3
    if full:
        msg.reasons.extend(p.reasons)
        msg.rejected.extend(_gpu_rej(r) for r in p.rejected)
    msg.reasons.extend(notes)
    deps = msg.dependencies
    for d in p.dependencies:
        deps.add(service=d.service, endpoint=d.endpoint, role=d.role, predicted_ms=d.predicted * 1e3, bound_ms=d.bound * 1e3)
    msg.stale, msg.snapshot_version = p.stale, max(p.snapshot_version, 0)
    msg.probes.extend(p.probes)
    if p.session_move is not None:
        m, sm = p.session_move, msg.session_move
        sm.SetInParent()
        sm.session, sm.from_gpu, sm.to_gpu, sm.reason = m.session, m.from_gpu, m.to_gpu, m.reason


def render_var(x: Scalar) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


_RULES: dict[tuple[str, tuple[str, ...]], list["pb.MatchedRule"]] = {}
_RULES_MAX = 4096
_VARS: dict[tuple[tuple[str, Scalar], ...], dict[str, str]] = {}
_VARS_MAX = 4096


def rendered_variables(variables: Mapping[str, Scalar]) -> dict[str, str]:
    """The `variables` field: rendered once per distinct set of request variables (a request
    shape repeats its variables; rendering floats with `:g` is the slow part). The dict is
    shared: read it, never mutate it."""
    key = tuple(variables.items())
    hit = _VARS.get(key)
    if hit is None:
        if len(_VARS) >= _VARS_MAX:
            _VARS.clear()
        hit = _VARS[key] = {k: render_var(v) for k, v in key}
    return hit


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


def _head(d: Decision) -> "pb.Decision":
    return pb.Decision(outcome=_OUTCOME[d.outcome], bundle_hash=d.bundle_hash,
                       rules=matched_rules(d.bundle_hash, d.rules), candidates=d.candidates,
                       variables=rendered_variables(d.variables), retry_count=d.retry_count)


def _fill_tail(msg: "pb.Decision", d: Decision, full: bool) -> None:
    """The fields each decision has of its own: id, model, timing, placement, rejection."""
    t = d.timing
    msg.decision_id, msg.model = d.decision_id, d.model or ""
    tm = msg.timing
    tm.SetInParent()
    tm.parse_us, tm.feasibility_us, tm.match_us = t.parse * 1e6, t.feasibility * 1e6, t.match * 1e6
    tm.place_us, tm.total_us = t.place * 1e6, t.total * 1e6
    if d.plan is not None:
        msg.placement.SetInParent()
        fill_placement(msg.placement, d.plan, d.model, d.region, full=full, notes=d.notes, endpoint=d.endpoint)
    if d.rejection is not None:
        msg.rejection.CopyFrom(rejection_msg(d.rejection))


def rejection_msg(r: Rejection) -> "pb.Rejection":
    return pb.Rejection(stage=_STAGE[r.stage], reason=r.reason, rule_ids=list(r.rule_ids), spans=[span(s) for s in r.spans],
                        eliminations=[rule_explanation(e) for e in r.eliminations], binding_constraint=r.binding,
                        gpus=[_gpu_rej(g) for g in r.gpus])


def decision(d: Decision, *, full: bool = False) -> "pb.Decision":
    """The response to Decide (`full`: with the placer's reasons, as Explain gives). Built on
    the event loop for every call, so sub-messages are filled in place and the parts that
    repeat per request shape (matched rules, rendered variables) come from caches."""
    msg = _head(d)
    _fill_tail(msg, d, full)
    return msg


def decision_head(d: Decision) -> bytes:
    """The serialized fields of `d` that every decision of its request shape repeats while
    the registry is unchanged: outcome, bundle, matched rules, candidate count, variables,
    retry count. Kept per shape by the service (see `decision_bytes`)."""
    return _head(d).SerializeToString()


def decision_bytes(d: Decision, head: bytes, rejection: bytes | None = None) -> bytes:
    """Decide's serialized response: `head` (from `decision_head` of a decision with the
    same head fields) followed by this decision's own fields, written as wire bytes
    (`decision_wire.tail`; `rejection`: its rejection field, when the caller keeps it).
    Protobuf reads concatenated messages as one merged message and the two parts set
    disjoint fields, so this parses to exactly `decision(d)`; only the field order on the
    wire differs."""
    if rejection is None and d.rejection is not None:
        rejection = rejection_field(d.rejection)
    return head + decision_wire.tail(d, rejection or b"")


def rejection_field(r: Rejection) -> bytes:
    """Decision.rejection (field 7) as wire bytes, written by protobuf."""
    return decision_wire.submessage(7, rejection_msg(r).SerializeToString())


def account(a: Account) -> "pb.Explanation":
    msg = pb.Explanation(decision=decision(a.decision, full=True), feasibility=a.feasibility, narrative=list(a.narrative))
    ex = a.explanation
    if ex is not None:
        msg.live_instances, msg.matching = ex.live, ex.count
        msg.rules.extend(rule_explanation(r) for r in ex.rules)
        msg.shards, msg.shards_skipped_by_bloom = ex.shards, ex.shards_skipped_by_bloom
    return msg


MAX_ID_CHARS = 256
MAX_LABELS = 64
_PRINTABLE = re.compile(r"[\x20-\x7e]*")


def _check_text(value: str, field: str, limit: int = MAX_ID_CHARS) -> None:
    """Identifiers and deployment facts are short printable ASCII: a 1 MB instance id or a
    NUL in a host name is refused here, naming the field (never echoed raw)."""
    if len(value) > limit or not _PRINTABLE.fullmatch(value):
        why = (f"`{field}` must be printable ASCII of at most {limit} characters "
               f"(got {len(value):,} characters{', with control or non-ASCII characters' if not _PRINTABLE.fullmatch(value) else ''})")
        raise ServiceError(Status.INVALID_ARGUMENT, why, (why,), field=field)


def _check_instance_fields(msg: "pb.RegisterInstanceRequest") -> None:
    _check_text(msg.id, "id")
    _check_text(msg.model, "model")
    d = msg.deployment
    for f in ("host", "gpu", "gpu_model", "region", "session_state", "cuda", "endpoint"):
        _check_text(getattr(d, f), f"deployment.{f}")
    if d.cuda and version_key(d.cuda) is None:
        why = f"`deployment.cuda` `{d.cuda}` is not a version (digits and dots, such as 12.4)"
        raise ServiceError(Status.INVALID_ARGUMENT, why, (why,), field="deployment.cuda")
    if len(msg.labels) > MAX_LABELS:
        raise ServiceError(Status.INVALID_ARGUMENT, f"at most {MAX_LABELS} labels, got {len(msg.labels)}", field="labels")
    for k, v in msg.labels.items():
        _check_text(k, "labels")
        _check_text(v, f"labels.{k}", 4096)


def instance(msg: "pb.RegisterInstanceRequest", model: str) -> Instance:
    if not msg.id:
        raise ServiceError(Status.INVALID_ARGUMENT, "instance `id` is required", field="id")
    _check_instance_fields(msg)
    if not msg.HasField("deployment"):
        raise ServiceError(Status.INVALID_ARGUMENT, f"instance `{msg.id}`: `deployment` is required", field="deployment")
    d = msg.deployment
    missing = [f for f in ("host", "gpu", "gpu_model", "region") if not getattr(d, f)]
    if missing:
        raise ServiceError(Status.INVALID_ARGUMENT, f"instance `{msg.id}`: deployment field `{missing[0]}` is required",
                           tuple(f"deployment.{m} is required" for m in missing), field=f"deployment.{missing[0]}")
    endpoint = ""
    if d.endpoint:
        try:
            endpoint = canonical_endpoint(d.endpoint)
        except ValueError as e:
            raise ServiceError(Status.INVALID_ARGUMENT, f"instance `{msg.id}`: deployment field `endpoint` {e}",
                               (f"deployment.endpoint {e}",), field="deployment.endpoint") from None
    dep = Deployment(host=d.host, gpu=d.gpu, gpu_model=d.gpu_model, region=d.region, numa_node=d.numa_node, tpm=d.tpm,
                     memory_encryption=d.memory_encryption, hardware_firewall=d.hardware_firewall, tee=d.tee,
                     session_state=d.session_state or "remote", cuda=d.cuda or "12.4", endpoint=endpoint)
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

