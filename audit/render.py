"""How verification results, reports and explanations look to people (text, table, CSV)
and to machines (JSON). Kept out of the CLI so the auditor API can return the same JSON."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from typing import Any

from .query import Explanation, Report, ReportRow
from .records import ActionRecord, DecisionRecord, Figure
from .times import format_time
from .verify import ProblemKind, VerifyReport

# ---------------------------------------------------------------------- verify


def verify_json(r: VerifyReport) -> dict[str, Any]:
    first = r.first_bad
    return {
        "path": r.path,
        "ok": r.ok,
        "entries": r.entries,
        "last_seq": r.last_seq,
        "last_hash": r.last_hash,
        "checkpoints": r.checkpoints,
        "signatures_checked": r.signatures_checked,
        "sealed_seq": r.sealed_seq,
        "first_bad": None if first is None else {"seq": first.seq, "kind": first.kind.value, "message": first.message},
        "problems": [{"seq": p.seq, "kind": p.kind.value, "message": p.message} for p in sorted(r.problems, key=lambda p: p.seq)],
        "notes": r.notes,
        "durable_end": r.durable_end,
        "closed": r.closed,
        "last_checkpoint": None if r.last_checkpoint is None else r.last_checkpoint.model_dump(mode="json"),
        "anchor": None if r.last_checkpoint is None else f"{r.last_checkpoint.seq}:{r.last_checkpoint.hash}",
        "verdict": r.verdict,
        "unproven": r.unproven,
        "tail_proven": r.tail_proven,
        "proven_end": r.proven_end,
        "segments": r.segments,
        "pruned_through": r.pruned_through,
    }


def verify_text(r: VerifyReport) -> str:
    lines = []
    if r.ok:
        lines.append(f"{r.path}: ok: {r.entries} entries, chain intact through entry {r.last_seq}, {r.checkpoints} checkpoint(s)"
                     + (", signatures valid" if r.signatures_checked and r.checkpoints else ""))
    else:
        first = r.first_bad
        assert first is not None
        verdict = "DAMAGED" if first.kind is ProblemKind.DAMAGED else "TAMPERED"
        lines.append(f"{r.path}: {verdict}: first bad entry {first.seq} ({first.kind.value}): {first.message}")
        for p in sorted(r.problems, key=lambda p: p.seq):
            if p is not first:
                lines.append(f"  also: {p}")
    if r.ok and r.verdict == "green":
        by = "the sealed head" if r.head is not None and r.proven_end == r.head.seq else "the anchor"
        lines.append(f"  verdict: green: chain, signatures and the log's end verified (the end by {by})")
    elif r.ok:
        lines.append("  verdict: amber: no problem found, but not everything is verified:")
        lines.extend(f"    - {why}" for why in r.unproven)
    else:
        lines.append("  verdict: red")
    lines.append(f"  durable log ends at entry {r.durable_end} (sealed through {r.sealed_seq}"
                 + (", closed cleanly)" if r.closed else ", no close record after it)")
                 + (f", in {r.segments} segments" if r.segments > 1 else "")
                 + (f"; entries 1..{r.pruned_through} pruned by retention" if r.pruned_through else ""))
    if r.last_checkpoint is not None:
        lines.append(f"  anchor: {r.last_checkpoint.seq}:{r.last_checkpoint.hash} (keep it apart from the log: `verify --anchor`)")
    lines.extend(f"  note: {n}" for n in r.notes)
    return "\n".join(lines)


# ---------------------------------------------------------------------- report

_HEAD = ("decisions", "admitted", "rejected", "failed", "compute_s_meas", "gpu_s_meas", "gpu_s_est", "mem_GB_meas", "mem_GB_est", "net_MB_meas", "net_MB_est", "unacct", "lat_mean_ms", "lat_max_ms")


def _small(v: float) -> str:
    """Three decimals, or three significant digits for a measured figure below 1 (a few
    calls' compute seconds or network MB would otherwise read 0.000 or 0.001)."""
    return f"{v:.3f}" if v == 0 or v >= 1 else f"{v:.3g}"


def _cells(row: ReportRow) -> list[str]:
    return [
        str(row.decisions),
        str(row.admitted),
        str(row.rejected),
        str(row.failed),
        _small(row.compute_seconds_measured),
        _small(row.gpu_seconds_measured),
        f"{row.gpu_seconds_estimated:.3f}",
        f"{row.memory_bytes_measured / 1e9:.3f}",
        f"{row.memory_bytes_estimated / 1e9:.3f}",
        _small(row.network_bytes_measured / 1e6),
        f"{row.network_bytes_estimated / 1e6:.3f}",
        str(row.unaccounted),
        f"{row.latency_mean * 1e3:.3f}",
        f"{row.latency_max * 1e3:.3f}",
    ]


def report_table(rep: Report) -> str:
    header = [rep.by, *_HEAD]
    body = [[r.key, *_cells(r)] for r in rep.rows] + [["total", *_cells(rep.total)]]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    out = [f"audit report {format_time(rep.start)} .. {format_time(rep.end)} by {rep.by} ({rep.actions} enforcement action(s) in range)", fmt(header), fmt(["-" * w for w in widths])]
    out += [fmt(b) for b in body[:-1]] + [fmt(["-" * w for w in widths]), fmt(body[-1])]
    out.append("meas = measured (net: Envoy's access log; compute: the model server's own time, on any device; gpu: NVML); "
               "est = estimated from contract and placement; unacct = decisions with a figure absent")
    return "\n".join(out)


def report_csv(rep: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    fields = [f.name for f in dataclasses.fields(ReportRow)]
    w.writerow([rep.by if f == "key" else f for f in fields])
    for row in (*rep.rows, rep.total):
        w.writerow([getattr(row, f) for f in fields])
    return buf.getvalue().rstrip("\n")


def report_json(rep: Report) -> dict[str, Any]:
    return {
        "from": rep.start,
        "to": rep.end,
        "by": rep.by,
        "rows": [dataclasses.asdict(r) for r in rep.rows],
        "total": dataclasses.asdict(rep.total),
        "actions": rep.actions,
    }


# ---------------------------------------------------------------------- explain


def explain_json(ex: Explanation) -> dict[str, Any]:
    return {
        "entry": ex.entry.model_dump(mode="json"),
        "actions": [a.model_dump(mode="json") for a in ex.actions],
        "sealed_by": None if ex.sealed_by is None else ex.sealed_by.model_dump(mode="json"),
    }


def _fig(name: str, f: Figure | None, unit: str, indent: str = "    ") -> str:
    if f is None:
        return f"{indent}{name}: absent (nothing measured it and it cannot be estimated)"
    rng = f" (range {f.low:.6g}..{f.high:.6g})" if f.low is not None and f.high is not None else ""
    return f"{indent}{name}: {f.value:.6g} {unit}{rng}, {f.source.value} by {f.method}"


def explain_text(ex: Explanation) -> str:
    rec = ex.entry.record
    assert isinstance(rec, DecisionRecord)
    out = [
        f"decision {rec.decision_id}: {rec.outcome}" + (f" ({rec.reason})" if rec.reason else ""),
        f"  time: {format_time(rec.time)}   tenant: {rec.tenant}   model: {rec.model or '-'}",
        f"  bundle: {rec.bundle_hash}",
        "  request:",
        *(f"    {k}: {v}" for k, v in sorted(rec.request.items())),
        *(f"    ${k} = {v}" for k, v in sorted(rec.variables.items())),
        "  matched rules:" if rec.matched_rules else "  matched rules: none",
        *(f"    {m.id}  at {m.where()}" for m in rec.matched_rules),
    ]
    p = rec.placement
    if p is not None:
        share = f"{p.share:g}" if p.share is not None else "-"
        pred = f"{p.predicted_latency * 1e3:.1f} ms" if p.predicted_latency is not None else "-"
        out.append(f"  placement: instance {p.instance or '-'} on {p.host or '-'}/{p.gpu or '-'} ({p.gpu_model or '-'}, {p.region or '-'}), share {share}, predicted {pred}")
    stages = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in rec.latency.stages.items())
    out.append(f"  decision latency: {rec.latency.total * 1e3:.3f} ms" + (f" ({stages})" if stages else ""))
    out.append("  resources:")
    out.append(_fig("GPU time", rec.resources.gpu_seconds, "GPU-s"))
    out.append(_fig("memory traffic", rec.resources.memory_bytes, "bytes"))
    out.append(_fig("network", rec.resources.network_bytes, "bytes"))
    for a in ex.actions:
        act = a.record
        assert isinstance(act, ActionRecord)
        where = f" at {act.rule_origin.file}:{act.rule_origin.line}" if act.rule_origin else ""
        out.append(f"  action #{a.seq}: {act.kind} {act.target} -> {act.outcome}{' (dry run)' if act.dry_run else ''} by {act.rule or 'system'}{where}: {act.detail}")
        if act.resources is not None:  # an `accounting` record: what the call consumed, measured
            res = act.resources
            out.append(_fig("network", res.network_bytes, "bytes", "      "))
            out.append(_fig("compute", res.compute_seconds, "s", "      "))
            out.append(_fig("GPU time", res.gpu_seconds, "GPU-s", "      "))
    out.append(f"  chain: entry {ex.entry.seq}, hash {ex.entry.hash[:16]}...")
    s = ex.sealed_by
    out.append(f"  sealed by checkpoint #{s.id} at entry {s.seq} ({'signed' if s.signature else 'unsigned'}, {format_time(s.time)})" if s else "  not yet sealed by a checkpoint")
    return "\n".join(out)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
