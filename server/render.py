"""Decisions and explanations as readable text (for `policyc decide` and the demo), and as
JSON (`--format json`, protobuf's own JSON mapping)."""

from __future__ import annotations

from google.protobuf.json_format import MessageToJson

from .proto import pb


def _where(s: "pb.SourceSpan") -> str:
    return f"{s.file}:{s.line}"


def decision_text(d: "pb.Decision") -> str:
    out: list[str] = []
    if d.outcome == pb.ADMITTED:
        p = d.placement
        lat = p.predicted
        out.append(f"ADMITTED  {d.model} → {p.instance_id}")
        out.append(f"  placement   {p.host}/{p.gpu} ({p.gpu_model}, {p.region}, NUMA {p.numa_node}"
                   + (f", RDMA {p.rdma_port}" if p.rdma_port else "") + f"), share {p.share:.3f} from the {p.share_source}"
                   + (f", queue depth {p.queue_depth}" if p.queue_depth else ""))
        out.append(f"  predicted   {lat.total_ms:.1f} ms ± {lat.sigma_ms:.1f} ms = network {lat.network_ms:.1f} + queueing "
                   f"{lat.queueing_ms:.1f} + compute {lat.compute_ms:.1f} + dependencies {lat.dependencies_ms:.1f} ms")
        for dep in p.dependencies:
            out.append(f"  dependency  `{dep.service}` → {dep.endpoint} ({dep.role}, {dep.predicted_ms:.2f} ms ≤ {dep.bound_ms:g} ms)")
        if p.HasField("session_move"):
            out.append(f"  session     moved {p.session_move.from_gpu} → {p.session_move.to_gpu}: {p.session_move.reason}")
        for r in p.reasons:
            out.append(f"  why         {r}")
    else:
        r = d.rejection
        stage = pb.Stage.Name(r.stage).lower()
        out.append(f"REJECTED  by the {stage} check" + (f" ({r.binding_constraint})" if r.binding_constraint else ""))
        out.append(f"  reason      {r.reason}")
        for s, rid in zip(r.spans, r.rule_ids):
            out.append(f"  rule        `{rid}` at {_where(s)}")
        if r.spans and not r.rule_ids:
            out.append("  declared at " + ", ".join(_where(s) for s in r.spans))
        for e in r.eliminations:
            for p in e.predicates:
                out.append(f"  predicate   `{p.predicate}` ({_where(p.origin)}) fails on {p.failing} instance(s)")
        for g in r.gpus[:4]:
            out.append(f"  not         {g.gpu}: {g.constraint} ({g.detail})")
    if d.rules:
        out.append("  rules       " + ", ".join(f"{m.id} ({_where(m.origin)})" for m in d.rules))
    t = d.timing
    out.append(f"  decided in  {t.total_us:.0f} µs (parse {t.parse_us:.0f}, feasibility {t.feasibility_us:.0f}, "
               f"match {t.match_us:.0f}, place {t.place_us:.0f}) over {d.candidates} candidate(s)"
               + (f"; retry {d.retry_count}" if d.retry_count else ""))
    out.append(f"  decision    {d.decision_id} under bundle {d.bundle_hash[:23]}…")
    return "\n".join(out)


def explanation_text(e: "pb.Explanation") -> str:
    return "\n".join(["EXPLAIN", *(f"  {line}" for line in e.narrative)])


def to_json(msg) -> str:  # type: ignore[no-untyped-def]
    return MessageToJson(msg, preserving_proto_field_name=True, sort_keys=True, indent=2)
