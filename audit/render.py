"""How verification results, reports and explanations look to people (text, table, CSV)
and to machines (JSON). Kept out of the CLI so the auditor API can return the same JSON."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from typing import Any

from .query import Explanation, Report, ReportRow
from .records import ActionRecord, DecisionRecord, Entry, Figure, Source
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

_HEAD = ("decisions", "admitted", "rejected", "failed", "compute_s_meas", "compute_s_app", "gpu_s_meas", "gpu_s_app", "gpu_s_est",
         "mem_GB_meas", "mem_GB_app", "mem_GB_est", "net_MB_meas", "net_MB_est", "unacct", "lat_mean_ms", "lat_max_ms")


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
        _small(row.compute_seconds_apportioned),
        _small(row.gpu_seconds_measured),
        _small(row.gpu_seconds_apportioned),
        f"{row.gpu_seconds_estimated:.3f}",
        f"{row.memory_bytes_measured / 1e9:.3f}",
        f"{row.memory_bytes_apportioned / 1e9:.3f}",
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
               "app = apportioned (a measured total divided across concurrent calls by a stated rule; compute: "
               "the serving process's cgroup CPU time, gpu: NVML's per-process samples); "
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
    return f"{indent}{name}: {f.value:.6g}{' ' + unit if unit else ''}{rng}, {f.source.value} by {f.method}"


# Each quantity once, in this order: (Resources field, the name shown, unit).
QUANTITIES: tuple[tuple[str, str, str], ...] = (
    ("gpu_seconds", "GPU time", "GPU-s"),
    ("compute_seconds", "compute", "s"),
    ("memory_bytes", "memory traffic", "bytes"),
    ("network_bytes", "network", "bytes"),
)
_RANK = {Source.MEASURED: 0, Source.APPORTIONED: 1, Source.ESTIMATED: 2}


def _figures(rec: DecisionRecord, actions: tuple[Entry, ...]) -> dict[str, list[tuple[Figure, str]]]:
    """Every figure of the call per quantity, with where it was recorded: the decision
    record's (estimates, or what was measured at decision time) and its accounting
    records' (what the data plane measured). An accounting record from before
    `compute_seconds` carried the model server's compute time under `gpu_seconds`
    (`query.LEGACY_COMPUTE_METHOD`): it is shown as compute, which it was."""
    from .query import LEGACY_COMPUTE_METHOD

    out: dict[str, list[tuple[Figure, str]]] = {q: [] for q, _, _ in QUANTITIES}
    for q in out:
        f = getattr(rec.resources, q, None)
        if f is not None:
            out[q].append((f, "the decision record"))
    for a in actions:
        act = a.record
        if not isinstance(act, ActionRecord) or act.resources is None:
            continue
        for q in out:
            f = getattr(act.resources, q, None)
            if f is None:
                continue
            if q == "gpu_seconds" and f.method.startswith(LEGACY_COMPUTE_METHOD.rstrip("%")):
                out["compute_seconds"].append((f, f"accounting record #{a.seq}"))
            else:
                out[q].append((f, f"accounting record #{a.seq}"))
    return out


def _resources(rec: DecisionRecord, actions: tuple[Entry, ...]) -> list[str]:
    """One line per quantity: the strongest evidence (measured, then apportioned, then
    estimated; several records of the same kind summed), and the contract's estimate
    beside a measurement, labelled as such, never in its place."""
    lines = []
    every = _figures(rec, actions)
    for q, name, unit in QUANTITIES:
        figs = every[q]
        if not figs:
            if q != "compute_seconds":  # compute time is only ever measured by the data plane
                lines.append(_fig(name, None, unit))
            continue
        best = min(_RANK[f.source] for f, _ in figs)
        top = [(f, where) for f, where in figs if _RANK[f.source] == best]
        if len(top) == 1:
            f, where = top[0]
            line = _fig(name, f, unit) + f" ({where})"
        else:
            total = sum(f.value for f, _ in top)
            kind = top[0][0].source.value
            line = (f"    {name}: {total:.6g} {unit}, {kind}, the sum of {len(top)} records: "
                    + "; ".join(f"{f.value:.6g} by {f.method} ({where})" for f, where in top))
        rest = [(f, where) for f, where in figs if _RANK[f.source] > best]
        if rest:
            line += "; not counted as evidence: " + "; ".join(
                f"{f.source.value} {f.value:.6g}" + (f" (range {f.low:.6g}..{f.high:.6g})" if f.low is not None and f.high is not None else "")
                + f" by {f.method}" for f, _ in rest)
        lines.append(line)
    lines += _groups(rec, actions)
    return lines


def _groups(rec: DecisionRecord, actions: tuple[Entry, ...]) -> list[str]:
    """Figures kept in a group of their own (e.g. an LLM call's `llm`: tokens and token
    times), each printed once with its kind and source, from whichever record holds it."""
    from pydantic import BaseModel

    lines = []
    holders: list[tuple[BaseModel, str]] = [(rec, "the decision record"), (rec.resources, "the decision record")]
    for a in actions:
        if isinstance(a.record, ActionRecord):
            holders.append((a.record, f"accounting record #{a.seq}"))
            if a.record.resources is not None:
                holders.append((a.record.resources, f"accounting record #{a.seq}"))
    for res, where in holders:
        for name in type(res).model_fields:
            if name == "resources":
                continue
            group = getattr(res, name, None)
            if not isinstance(group, BaseModel):
                continue
            for sub in type(group).model_fields:
                f = getattr(group, sub, None)
                if isinstance(f, Figure):
                    lines.append(_fig(f"{name} {sub.replace('_', ' ')}", f, "") + f" ({where})")
    return lines


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
        *(["  rejected by:"] if rec.rejected_by else []),
        *(f"    {x.id} ({x.stage})" + (f"  at {x.where()}" if x.origin is not None else "") for x in rec.rejected_by or ()),
    ]
    p = rec.placement
    if p is not None:
        share = f"{p.share:g}" if p.share is not None else "-"
        pred = f"{p.predicted_latency * 1e3:.1f} ms" if p.predicted_latency is not None else "-"
        out.append(f"  placement: instance {p.instance or '-'} on {p.host or '-'}/{p.gpu or '-'} ({p.gpu_model or '-'}, {p.region or '-'}), share {share}, predicted {pred}")
    stages = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in rec.latency.stages.items())
    out.append(f"  decision latency: {rec.latency.total * 1e3:.3f} ms" + (f" ({stages})" if stages else ""))
    out.append("  resources (each quantity once: the strongest evidence, with its kind and source):")
    out.extend(_resources(rec, ex.actions))
    for a in ex.actions:
        act = a.record
        assert isinstance(act, ActionRecord)
        where = f" at {act.rule_origin.file}:{act.rule_origin.line}" if act.rule_origin else ""
        out.append(f"  action #{a.seq}: {act.kind} {act.target} -> {act.outcome}{' (dry run)' if act.dry_run else ''} by {act.rule or 'system'}{where}: {act.detail}")
    out.append(f"  chain: entry {ex.entry.seq}, hash {ex.entry.hash[:16]}...")
    s = ex.sealed_by
    out.append(f"  sealed by checkpoint #{s.id} at entry {s.seq} ({'signed' if s.signature else 'unsigned'}, {format_time(s.time)})" if s else "  not yet sealed by a checkpoint")
    return "\n".join(out)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
