"""Rendering a `ValidationReport` for people (text) and for CI systems (JSON).

The JSON shape is a stable, versioned contract with CI tooling: keys are never renamed,
only added.
"""

from __future__ import annotations

import json

from .validate import ValidationReport

REPORT_SCHEMA = "policyc.validate/v1"


def to_json_dict(r: ValidationReport) -> dict[str, object]:
    out: dict[str, object] = {
        "schema": REPORT_SCHEMA,
        "model": r.model,
        "ok": r.ok,
        "verdict": r.verdict.value,
        "message": r.message,
        "tolerance": r.tolerance,
        "contract": r.contract.name if r.contract else None,
        "field": r.field,
        "tokens": r.contract.compute.tokens if r.contract else None,
        "declared_flops": None if r.declared_lo is None else {"lo": r.declared_lo, "hi": r.declared_hi},
        "counted_flops": r.counted,
        "deviation": r.deviation,
        "dominant_ops": [{"op": d.op, "flops": d.flops, "share": round(d.share, 6)} for d in r.dominant],
        "problems": list(r.problems),
    }
    if r.run is not None:
        out["run"] = {
            "ok": r.run.ok,
            "tokens": r.run.tokens,
            "static_flops": r.run.static_flops,
            "executed_flops": r.run.executed_flops,
            "executed_nodes": r.run.executed_nodes,
            "seconds": round(r.run.run_seconds, 6),
            "mismatches": [
                {"node": m.node, "op": m.op_type, "static": m.static, "executed": m.executed} for m in r.run.mismatches
            ],
        }
    return out


def render_json(r: ValidationReport) -> str:
    return json.dumps(to_json_dict(r), sort_keys=True, indent=1)


def render_text(r: ValidationReport) -> str:
    head = "ok" if r.ok else f"error[{r.verdict.value}]"
    lines = [f"{head}: {r.message}"]
    if r.counted is not None and r.declared_lo is not None:
        lines.append(f"  declared: {r.declared_lo:.4g} .. {r.declared_hi:.4g} FLOPs (tolerance ±{r.tolerance:.0%})")
        lines.append(f"  measured: {r.counted:.4g} FLOPs (counted from the graph)")
    if r.dominant:
        lines.append("  dominant ops:")
        lines.extend(f"    {d.op:<28} {d.flops:>12.4g} FLOPs {d.share:7.1%}" for d in r.dominant)
    if len(r.problems) > 1:
        lines.append("  nodes that could not be counted:")
        lines.extend(f"    {p}" for p in r.problems[:20])
        if len(r.problems) > 20:
            lines.append(f"    … and {len(r.problems) - 20} more")
    if r.run is not None:
        lines.append(
            f"  --run: {r.run.executed_nodes} nodes executed at {r.run.tokens} tokens in {r.run.run_seconds * 1e3:.1f} ms; "
            f"recount {r.run.executed_flops:,} vs static {r.run.static_flops:,} FLOPs"
        )
    return "\n".join(lines)
