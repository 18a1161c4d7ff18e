"""`policyc audit report --format html`: one self-contained page an auditor can hand over.

The page carries the chain's verdict (from `verify`), per-model and per-tenant tables
(the same figures as `report`, measured and estimated apart), and charts drawn as inline
SVG: decisions per model and per tenant (admitted / rejected / failed), rejections by
reason, decisions over time, and GPU seconds measured against estimated over time. No
script, no font, no image, no stylesheet is fetched: a Content-Security-Policy of
`default-src 'none'` forbids it, so the page reads the same offline, years later.
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .query import AuditReader, Report, ReportRow
from .records import DecisionRecord
from .times import format_time
from .verify import VerifyReport

BINS = 24  # time buckets of the series charts
TOP_REASONS = 12
COLORS = {"admitted": "#2e7d32", "rejected": "#c62828", "failed": "#6a1b9a", "measured": "#1565c0", "estimated": "#ef6c00"}


@dataclass
class Series:
    """Per time bucket: decisions by outcome, GPU seconds measured and estimated."""

    start: float
    width: float
    admitted: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    gpu_measured: list[float] = field(default_factory=list)
    gpu_estimated: list[float] = field(default_factory=list)


@dataclass
class PageData:
    path: str
    verdict: VerifyReport
    by_model: Report
    by_tenant: Report
    reasons: list[tuple[str, int]]
    series: Series | None


def _decisions(reader: AuditReader, start: float | None, end: float | None) -> Iterable[DecisionRecord]:
    from .records import EntryKind

    after = 0
    while True:
        page = reader.entries(start=start, end=end, kind=EntryKind.DECISION, after_seq=after, limit=5000)
        if not page:
            return
        for e in page:
            if isinstance(e.record, DecisionRecord):
                yield e.record
        after = page[-1].seq


def gather(path: str, verdict: VerifyReport, start: float | None = None, end: float | None = None) -> PageData:
    """Everything the page shows, read once from the log."""
    with AuditReader.open(path) as reader:
        by_model = reader.report(by="model", start=start, end=end)
        by_tenant = reader.report(by="tenant", start=start, end=end)
        records = list(_decisions(reader, start, end))
    reasons: dict[str, int] = {}
    for r in records:
        if r.outcome != "admitted":
            key = (r.reason or "(no reason given)")[:120]
            reasons[key] = reasons.get(key, 0) + 1
    series = None
    if records:
        t0 = min(r.time for r in records)
        t1 = max(r.time for r in records)
        width = max((t1 - t0) / BINS, 1e-9)
        n = BINS if t1 > t0 else 1
        series = Series(t0, width, [0] * n, [0] * n, [0] * n, [0.0] * n, [0.0] * n)
        for r in records:
            i = min(int((r.time - t0) / width), n - 1)
            getattr(series, r.outcome)[i] += 1
            g = r.resources.gpu_seconds
            if g is not None:
                (series.gpu_measured if g.source == "measured" else series.gpu_estimated)[i] += g.value
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    return PageData(path, verdict, by_model, by_tenant, ranked[:TOP_REASONS], series)


# ---------------------------------------------------------------------- drawing
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * mag:
            return m * mag
    return 10 * mag


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def stacked_bars(title: str, rows: Sequence[ReportRow]) -> str:
    """Horizontal bars per group: admitted, rejected, failed."""
    rows = list(rows)[:20]
    bar_h, label_w, w = 18, 150, 570
    h = 30 + bar_h * len(rows) + 8 * len(rows) + 24
    top = _nice_max(max((r.decisions for r in rows), default=1))
    scale = (w - label_w - 60) / top
    out = [f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{_e(title)}">',
           f'<text x="0" y="16" class="title">{_e(title)}</text>']
    y = 30
    for r in rows:
        out.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{_e(r.key[:26])}</text>')
        x = float(label_w)
        for kind, n in (("admitted", r.admitted), ("rejected", r.rejected), ("failed", r.failed)):
            if n:
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{n * scale:.1f}" height="{bar_h}" fill="{COLORS[kind]}">'
                           f'<title>{_e(r.key)}: {n} {kind}</title></rect>')
                x += n * scale
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{r.decisions}</text>')
        y += bar_h + 8
    out.append(_legend(("admitted", "rejected", "failed"), 0, h - 6))
    out.append("</svg>")
    return "".join(out)


def reason_bars(reasons: Sequence[tuple[str, int]]) -> str:
    title = "Rejections by reason"
    if not reasons:
        return f'<p class="empty">{title}: none in range.</p>'
    bar_h, label_w, w = 18, 470, 1150
    h = 30 + (bar_h + 8) * len(reasons)
    top = _nice_max(max(n for _, n in reasons))
    scale = (w - label_w - 60) / top
    out = [f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{title}">',
           f'<text x="0" y="16" class="title">{title}</text>']
    y = 30
    for reason, n in reasons:
        short = reason if len(reason) <= 78 else reason[:77] + "…"
        out.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{_e(short)}</text>'
                   f'<rect x="{label_w}" y="{y}" width="{n * scale:.1f}" height="{bar_h}" fill="{COLORS["rejected"]}">'
                   f'<title>{_e(reason)}: {n}</title></rect>'
                   f'<text x="{label_w + n * scale + 4:.1f}" y="{y + 13}">{n}</text>')
        y += bar_h + 8
    out.append("</svg>")
    return "".join(out)


def line_chart(title: str, series: Series, lines: Sequence[tuple[str, Sequence[float]]], unit: str) -> str:
    """Lines over the time buckets, with a y axis and the range's first and last times."""
    w, h, left, bottom, top_pad = 570, 270, 60, 40, 44
    n = len(lines[0][1])
    top = _nice_max(max((max(v, default=0) for _, v in lines), default=0))
    plot_w, plot_h = w - left - 20, h - bottom - top_pad

    def xy(i: int, v: float) -> tuple[float, float]:
        x = left + (plot_w * (i + 0.5) / n)
        return x, top_pad + plot_h * (1 - v / top)

    out = [f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{_e(title)}">',
           f'<text x="0" y="16" class="title">{_e(title)}</text>']
    for k in range(5):
        v = top * k / 4
        _, y = xy(0, v)
        out.append(f'<line x1="{left}" x2="{w - 20}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    out.append(f'<text x="{left}" y="{h - 22}">{_e(format_time(series.start))}</text>'
               f'<text x="{w - 20}" y="{h - 22}" text-anchor="end">{_e(format_time(series.start + series.width * n))}</text>'
               f'<text x="{left - 6}" y="{top_pad - 12}" text-anchor="end">{_e(unit)}</text>')
    for name, values in lines:
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(values)))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{COLORS[name]}" stroke-width="2"><title>{_e(name)}</title></polyline>')
        for i, v in enumerate(values):
            x, y = xy(i, v)
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{COLORS[name]}"><title>{_e(name)}: {_fmt(v)}</title></circle>')
    out.append(_legend(tuple(name for name, _ in lines), left, h - 4))
    out.append("</svg>")
    return "".join(out)


def _legend(names: Sequence[str], x: float, y: float) -> str:
    out = []
    for name in names:
        out.append(f'<rect x="{x}" y="{y - 10}" width="10" height="10" fill="{COLORS[name]}"/>'
                   f'<text x="{x + 14}" y="{y}">{_e(name)}</text>')
        x += 24 + 8 * len(name)
    return "".join(out)


# ---------------------------------------------------------------------- page
_HEAD = ("decisions", "admitted", "rejected", "failed", "compute s meas", "GPU s meas", "GPU s est", "HBM GB meas", "HBM GB est",
         "net MB meas", "net MB est", "unaccounted", "latency mean ms", "latency max ms")


def _cells(r: ReportRow) -> list[str]:
    return [str(r.decisions), str(r.admitted), str(r.rejected), str(r.failed), _fmt(r.compute_seconds_measured),
            _fmt(r.gpu_seconds_measured), _fmt(r.gpu_seconds_estimated),
            _fmt(r.memory_bytes_measured / 1e9), _fmt(r.memory_bytes_estimated / 1e9),
            _fmt(r.network_bytes_measured / 1e6), _fmt(r.network_bytes_estimated / 1e6), str(r.unaccounted),
            _fmt(r.latency_mean * 1e3), _fmt(r.latency_max * 1e3)]


def table(rep: Report) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in (rep.by, *_HEAD))
    body = "".join("<tr>" + f"<th scope=\"row\">{_e(r.key)}</th>" + "".join(f"<td>{c}</td>" for c in _cells(r)) + "</tr>"
                   for r in rep.rows)
    total = "<tr class=\"total\"><th scope=\"row\">total</th>" + "".join(f"<td>{c}</td>" for c in _cells(rep.total)) + "</tr>"
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}{total}</tbody></table>"


def verdict_box(v: VerifyReport) -> str:
    if v.ok:
        sig = ", checkpoint signatures valid" if v.signatures_checked and v.checkpoints else ""
        text = (f"Chain intact: {v.entries} entries through entry {v.last_seq}, {v.checkpoints} checkpoint(s){sig}; "
                f"sealed through entry {v.sealed_seq}.")
        cls = "ok"
    else:
        first = v.first_bad
        text = f"TAMPERED: first bad entry {first.seq} ({first.kind.value}): {first.message}" if first else "TAMPERED"
        cls = "bad"
    notes = "".join(f"<li>{_e(n)}</li>" for n in v.notes)
    last = v.last_checkpoint
    anchor = f"<p class=\"mono\">last checkpoint: seq {last.seq}, hash {_e(last.hash)}</p>" if last else ""
    return f'<section class="verdict {cls}"><h2>Chain verdict</h2><p>{_e(text)}</p>{anchor}{"<ul>" + notes + "</ul>" if notes else ""}</section>'


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#1b1b1b;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555}.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.verdict{border-radius:6px;padding:4px 16px;margin-top:16px}.verdict h2{border:0;margin-top:10px}
.verdict.ok{background:#e8f5e9;border:1px solid #2e7d32}.verdict.bad{background:#ffebee;border:1px solid #c62828}
table{border-collapse:collapse;width:100%;font-size:12.5px;margin:8px 0}th,td{padding:4px 6px;border-bottom:1px solid #e4e4e4;text-align:right}
thead th{background:#f4f4f4;position:sticky;top:0}tbody th{text-align:left;font-weight:600}tr.total{background:#fafafa;font-weight:600}
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{flex:0 1 auto;max-width:100%;height:auto;font-size:11px}
.chart .title{font-size:13px;font-weight:600}.chart .grid{stroke:#e0e0e0}.empty{color:#666}
footer{margin-top:32px;color:#666;font-size:12px}
"""


def render(data: PageData) -> str:
    """The page, as one string."""
    s0 = data.series
    first = data.by_model.start if data.by_model.start is not None else (s0.start if s0 else None)
    last = data.by_model.end if data.by_model.end is not None else (s0.start + s0.width * len(s0.admitted) if s0 else None)
    rng = f"{format_time(first)} .. {format_time(last)}"
    charts_time = ""
    if data.series is not None:
        s = data.series
        charts_time = (line_chart("Decisions over time", s, (("admitted", s.admitted), ("rejected", s.rejected),
                                                               ("failed", s.failed)), "count")
                       + line_chart("GPU seconds over time: measured vs estimated", s,
                                    (("measured", s.gpu_measured), ("estimated", s.gpu_estimated)), "GPU s"))
    return "".join([
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>policyc audit report: {_e(os.path.basename(data.path))}</title><style>{CSS}</style></head><body>",
        (f"<h1>policyc audit report</h1><p class=\"meta\">log <span class=\"mono\">{_e(data.path)}</span> · range {_e(rng)} · "
        f"{data.by_model.total.decisions} decisions · {data.by_model.actions} enforcement action(s)</p>"),
        verdict_box(data.verdict),
        "<h2>Per model</h2>", table(data.by_model),
        "<div class=\"charts\">", stacked_bars("Decisions per model", data.by_model.rows),
        stacked_bars("Decisions per tenant", data.by_tenant.rows), "</div>",
        "<h2>Per tenant</h2>", table(data.by_tenant),
        "<h2>Rejections and resources</h2><div class=\"charts\">", reason_bars(data.reasons), charts_time, "</div>",
        ("<footer>meas = measured (NVML, kernel flow counters); est = estimated from the contract and the placement; "
        "unaccounted = decisions with a figure absent (never invented). Measured and estimated figures are summed apart.</footer>"),
        "</body></html>\n",
    ])


def html_report(path: str, verdict: VerifyReport, start: float | None = None, end: float | None = None) -> str:
    return render(gather(path, verdict, start, end))
