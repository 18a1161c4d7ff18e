"""`policyc audit report --format html`: one self-contained page an auditor can hand over.

The page names what it is evidence of before anything else: the log and its anchor, the
bundle(s) in force (hash, and whether a signature was checked), the policy sources'
revision, the time range, the policyc that wrote it, and when and by whom. Then the
verdict: red when the chain fails, amber when something could not be verified (no public
key given, the log's end unproven, a bundle signature unchecked), green only when
everything was. Then the figures: per model, tenant and region (measured, apportioned and
estimated apart), rejections grouped by the rule that rejected them with the rule's source
line, and decisions and GPU time over a labelled time axis. Charts are inline SVG; no
script, font, image or stylesheet is fetched (a Content-Security-Policy of `default-src
'none'` forbids it), so the page reads the same offline, years later. `--sign` adds a
detached signature beside it (`report_signature.py`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Iterable

from .html_charts import Series, e, fmt, labelled_bars, line_chart, stacked_bars
from .provenance import BundleState, generated_by, policyc_version
from .query import AuditReader, Report, ReportRow
from .records import DecisionRecord
from .times import format_time
from .verify import VerifyReport

BINS = 24  # time buckets of the series charts
TOP_RULES = 15
KINDS = ("measured", "apportioned", "estimated")


@dataclass(frozen=True, slots=True)
class Provenance:
    """What the auditor tells the report about its context (all optional)."""

    bundle: BundleState | None = None
    sources: str | None = None  # the policy sources' revision (`provenance.sources_revision`)
    generated_by: str = field(default_factory=generated_by)
    generated_at: float = field(default_factory=time.time)
    version: str = field(default_factory=policyc_version)


@dataclass
class RuleRejections:
    """Rejections (and failures) attributed to one rule."""

    rule: str
    where: str  # file:line of the rule, or "" when the record names no rule
    count: int = 0
    example: str = ""


@dataclass
class BundleSeen:
    hash: str
    decisions: int
    first: float
    last: float


@dataclass
class PageData:
    path: str
    verdict: VerifyReport
    by_model: Report
    by_tenant: Report
    by_region: Report
    rules: list[RuleRejections]
    bundles: list[BundleSeen]
    series: Series | None
    provenance: Provenance
    segments_left_out: int = 0


def _decisions(reader: AuditReader, start: float | None, end: float | None) -> Iterable[DecisionRecord]:
    from .records import EntryKind

    after = 0
    while True:
        page = reader.entries(start=start, end=end, kind=EntryKind.DECISION, after_seq=after, limit=5000)
        if not page:
            return
        for entry in page:
            if isinstance(entry.record, DecisionRecord):
                yield entry.record
        after = page[-1].seq


def _rules_of(r: DecisionRecord) -> list[tuple[str, str]]:
    """The rules a rejection is attributed to: those its record names as refusing it
    (`rejected_by`, each with its source line); for records written before it existed,
    the applied rules its reason names, else every rule that applied; none: the decision
    names no rule."""
    if r.rejected_by:
        return [(x.id, x.where()) for x in r.rejected_by]
    named = [(m.id, m.where()) for m in r.matched_rules if r.reason and m.id in r.reason]
    return named or [(m.id, m.where()) for m in r.matched_rules]


def gather(path: str, verdict: VerifyReport, start: float | None = None, end: float | None = None,
           provenance: Provenance | None = None) -> PageData:
    """Everything the page shows, read from the log (every kept segment) in one streamed
    pass over its decisions: memory stays bounded by the groups, not the records."""
    rules: dict[tuple[str, str], RuleRejections] = {}
    bundles: dict[str, BundleSeen] = {}
    series = None
    with AuditReader.open(path) as reader:
        by_model = reader.report(by="model", start=start, end=end)
        by_tenant = reader.report(by="tenant", start=start, end=end)
        by_region = reader.report(by="region", start=start, end=end)
        left_out = reader.segments_left_out
        t0, t1 = reader.time_span(start=start, end=end)
        if t0 is not None and t1 is not None:
            n = BINS if t1 > t0 else 1
            width = max((t1 - t0) / n, 1e-9) * (1 + 1e-9)
            series = Series(t0, width, [0] * n, [0] * n, [0] * n, {k: [0.0] * n for k in KINDS})
        for r in _decisions(reader, start, end):
            b = bundles.get(r.bundle_hash)
            if b is None:
                bundles[r.bundle_hash] = BundleSeen(r.bundle_hash, 1, r.time, r.time)
            else:
                b.decisions, b.first, b.last = b.decisions + 1, min(b.first, r.time), max(b.last, r.time)
            if series is not None:
                i = max(0, min(int((r.time - series.start) / series.width), len(series.admitted) - 1))
                getattr(series, r.outcome)[i] += 1
                gpu = r.resources.gpu_seconds
                if gpu is not None:
                    series.gpu[gpu.source.value][i] += gpu.value
            if r.outcome == "admitted":
                continue
            for rule, where in _rules_of(r) or [("(no rule named)", "")]:
                g = rules.setdefault((rule, where), RuleRejections(rule, where))
                g.count += 1
                g.example = g.example or (r.reason or "(no reason given)")
    ranked = sorted(rules.values(), key=lambda g: (-g.count, g.rule))
    return PageData(path, verdict, by_model, by_tenant, by_region, ranked[:TOP_RULES], sorted(bundles.values(), key=lambda b: b.first),
                    series, provenance or Provenance(), left_out)


# ---------------------------------------------------------------------- page
_HEAD = ("decisions", "admitted", "rejected", "failed", "compute s meas", "compute s app", "GPU s meas", "GPU s app", "GPU s est",
         "HBM GB meas", "HBM GB app", "HBM GB est", "net MB meas", "net MB est", "unaccounted", "latency mean ms", "latency max ms")


def _cells(r: ReportRow) -> list[str]:
    return [str(r.decisions), str(r.admitted), str(r.rejected), str(r.failed), fmt(r.compute_seconds_measured),
            fmt(r.compute_seconds_apportioned), fmt(r.gpu_seconds_measured), fmt(r.gpu_seconds_apportioned), fmt(r.gpu_seconds_estimated),
            fmt(r.memory_bytes_measured / 1e9), fmt(r.memory_bytes_apportioned / 1e9), fmt(r.memory_bytes_estimated / 1e9),
            fmt(r.network_bytes_measured / 1e6), fmt(r.network_bytes_estimated / 1e6), str(r.unaccounted),
            fmt(r.latency_mean * 1e3), fmt(r.latency_max * 1e3)]


def table(rep: Report) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in (rep.by, *_HEAD))
    body = "".join("<tr>" + f"<th scope=\"row\">{e(r.key)}</th>" + "".join(f"<td>{c}</td>" for c in _cells(r)) + "</tr>"
                   for r in rep.rows)
    total = "<tr class=\"total\"><th scope=\"row\">total</th>" + "".join(f"<td>{c}</td>" for c in _cells(rep.total)) + "</tr>"
    return f"<table class=\"figures\"><thead><tr>{head}</tr></thead><tbody>{body}{total}</tbody></table>"


def verdict_reasons(data: PageData) -> tuple[str, list[str]]:
    """(red | amber | green, why) for the whole page: the log's verdict, and the bundle's."""
    v = data.verdict
    color = v.verdict
    why = list(v.unproven)
    b = data.provenance.bundle
    if b is not None and b.signature == "invalid":
        color = "red"
        why.insert(0, f"the bundle's signature does not verify: {b.detail}")
    elif b is None:
        why.append("no bundle file was given (--bundle): the hashes in force below are the log's word, their signatures unchecked")
    elif not b.verified:
        why.append(f"the bundle's signature was not verified ({b.signature}: {b.detail})")
    elif data.bundles and any(s.hash != b.content_hash for s in data.bundles):
        why.append("decisions in range ran under bundles other than the one verified (see the bundles in force)")
    if color == "green" and why:
        color = "amber"
    return color, why


def verdict_box(data: PageData) -> str:
    v = data.verdict
    color, why = verdict_reasons(data)
    if not v.ok:
        first = v.first_bad
        text = (f"FAILED: the chain does not verify: first bad entry {first.seq} ({first.kind.value}): {first.message}" if first
                else "FAILED: the chain does not verify")
    elif color == "red":
        text = "FAILED: the bundle in force does not verify"
    else:
        sig = ", checkpoint signatures valid" if v.signatures_checked and v.checkpoints else ", checkpoint signatures NOT checked"
        text = (f"Chain intact: {v.entries} entries through entry {v.last_seq} in {v.segments} segment(s), {v.checkpoints} checkpoint(s)"
                f"{sig}; sealed through entry {v.sealed_seq}.")
        text += " Everything was verified." if color == "green" else " Not everything could be verified:"
    label = {"red": "RED", "amber": "AMBER", "green": "GREEN"}[color]
    items = "".join(f"<li>{e(w)}</li>" for w in why) if color != "green" else ""
    notes = "".join(f"<li>{e(n)}</li>" for n in v.notes)
    return (f'<section class="verdict {color}" id="verdict" data-verdict="{color}"><h2>Verdict: {label}</h2><p>{e(text)}</p>'
            + (f"<ul class=\"why\">{items}</ul>" if items else "")
            + (f"<details><summary>verification notes</summary><ul>{notes}</ul></details>" if notes else "") + "</section>")


def provenance_table(data: PageData, rng: str) -> str:
    p, v = data.provenance, data.verdict
    last = v.last_checkpoint
    anchor = f"{last.seq}:{last.hash}" if last else "none (the log has no checkpoint that checks out)"
    head = v.head
    end = (f"sealed head at entry {head.seq} ({'close record' if head.final else 'checkpoint'})" if head is not None else "no sealed head")
    b = p.bundle
    if b is not None:
        bundle = f"{b.content_hash} ({b.path}, compiled by policyc {b.compiler_version}); signature: {b.signature} — {b.detail}"
    else:
        bundle = "not given (--bundle): signature state unknown"
    in_force = "".join(f"<li><span class=\"mono\">{e(s.hash)}</span>: {s.decisions} decision(s), {e(format_time(s.first))} .. "
                       f"{e(format_time(s.last))}{_given(b, s.hash)}</li>"
                       for s in data.bundles) or "<li>no decision in range</li>"
    rows = [
        ("log", f"<span class=\"mono\">{e(data.path)}</span> ({v.segments} segment(s){f', entries 1..{v.pruned_through} pruned by retention' if v.pruned_through else ''})"),
        ("anchor", f"<span class=\"mono\">{e(anchor)}</span>; {e(end)}"),
        ("time range", e(rng)),
        ("bundle", f"<span class=\"mono\">{e(bundle)}</span>"),
        ("bundles in force", f"<ul class=\"plain\">{in_force}</ul>"),
        ("policy sources", e(p.sources or "not given (--sources): revision unknown")),
        ("policyc version", e(p.version)),
        ("generated", f"{e(format_time(p.generated_at))} by {e(p.generated_by)}"),
    ]
    body = "".join(f"<tr><th scope=\"row\">{e(k)}</th><td>{val}</td></tr>" for k, val in rows)
    return f"<table class=\"provenance\" id=\"provenance\"><tbody>{body}</tbody></table>"


def _given(b: BundleState | None, h: str) -> str:
    if b is None or h != b.content_hash:
        return ""
    return " (the bundle given, signature verified)" if b.verified else " (the bundle given)"


def rules_section(rules: list[RuleRejections]) -> str:
    if not rules:
        return "<p class=\"empty\">No rejection in range.</p>"
    rows = "".join(f"<tr><th scope=\"row\" class=\"mono\">{e(g.rule)}</th><td class=\"mono left\">{e(g.where or '-')}</td>"
                   f"<td>{g.count}</td><td class=\"left\">{e(g.example[:200])}</td></tr>" for g in rules)
    table_html = ("<table class=\"rules\"><thead><tr><th>rule</th><th>source</th><th>rejections</th><th>example reason</th></tr></thead>"
                  f"<tbody>{rows}</tbody></table>")
    return table_html + labelled_bars("Rejections by rule", [(f"{g.rule} ({g.where})" if g.where else g.rule, g.count) for g in rules])


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#1b1b1b;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.verdict{border-radius:6px;padding:4px 16px;margin-top:16px}.verdict h2{border:0;margin-top:10px}
.verdict.green{background:#e8f5e9;border:2px solid #2e7d32}.verdict.amber{background:#fff8e1;border:2px solid #f9a825}
.verdict.red{background:#ffebee;border:2px solid #c62828}
table{border-collapse:collapse;width:100%;font-size:12.5px;margin:8px 0}th,td{padding:4px 6px;border-bottom:1px solid #e4e4e4;text-align:right}
thead th{background:#f4f4f4}tbody th{text-align:left;font-weight:600}tr.total{background:#fafafa;font-weight:600}
table.provenance td,td.left{text-align:left}table.provenance th{width:150px;vertical-align:top}ul.plain{margin:0;padding-left:18px}
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{flex:0 1 auto;max-width:100%;height:auto;font-size:11px}
.chart .title{font-size:13px;font-weight:600}.chart .grid{stroke:#e0e0e0}.chart .axis{stroke:#888}.chart .tick{font-size:10.5px}
.chart .axis-title{fill:#555}.empty{color:#666}footer{margin-top:32px;color:#666;font-size:12px}
"""


def render(data: PageData) -> str:
    """The page, as one string."""
    s0 = data.series
    first = data.by_model.start if data.by_model.start is not None else (s0.start if s0 else None)
    last = data.by_model.end if data.by_model.end is not None else (s0.end if s0 else None)
    rng = f"{format_time(first)} .. {format_time(last)}"
    charts_time = ""
    if s0 is not None:
        kinds = [k for k in ("measured", "apportioned", "estimated") if any(s0.gpu[k]) or k != "apportioned"]
        charts_time = (line_chart("Decisions over time", s0, (("admitted", s0.admitted), ("rejected", s0.rejected),
                                                                ("failed", s0.failed)), "count")
                       + line_chart("GPU seconds over time: " + " vs ".join(kinds), s0, [(k, s0.gpu[k]) for k in kinds], "GPU s"))
    return "".join([
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>policyc audit report: {e(os.path.basename(data.path))}</title><style>{CSS}</style></head><body>",
        (f"<h1>policyc audit report</h1><p class=\"meta\">{data.by_model.total.decisions} decisions · "
         f"{data.by_model.actions} enforcement action(s) · {e(rng)}</p>"),
        provenance_table(data, rng),
        verdict_box(data),
        "<h2>Per model</h2>", table(data.by_model),
        "<h2>Per tenant</h2>", table(data.by_tenant),
        "<h2>Per region</h2>", table(data.by_region),
        "<div class=\"charts\">", stacked_bars("Decisions per model", data.by_model.rows),
        stacked_bars("Decisions per tenant", data.by_tenant.rows), stacked_bars("Decisions per region", data.by_region.rows), "</div>",
        "<h2>Rejections by rule</h2>", rules_section(data.rules),
        "<h2>Over time</h2><div class=\"charts\">", charts_time or "<p class=\"empty\">No decision in range.</p>", "</div>",
        ("<footer>meas = measured (network: Envoy's access log or the kernel's flow counters; compute: the model server's own "
         "timing of the call, as it reports it; GPU: NVML); app = apportioned, a measured total divided across concurrent calls by "
         "the rule each figure states; est = estimated from the contract and the placement; unaccounted = decisions with a figure "
         "absent (never invented). Kinds are summed apart; `policyc audit explain` and `export` give each figure's source."
         + (f" The {data.segments_left_out} oldest closed segment(s) are beyond what one report reads and are left out of its figures."
            if data.segments_left_out else "") + "</footer>"),
        "</body></html>\n",
    ])


def html_report(path: str, verdict: VerifyReport, start: float | None = None, end: float | None = None,
                provenance: Provenance | None = None) -> str:
    return render(gather(path, verdict, start, end, provenance))
