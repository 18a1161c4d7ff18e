"""The report's charts as inline SVG: no script, no font, nothing fetched.

Bars per group (admitted / rejected / failed), labelled bars (rejections by rule), and lines
over time on a time axis with several ticks whose labels say as much of the date as the
range needs (days, hours, or seconds) and whose zone is written on the axis (UTC).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Sequence

from .query import ReportRow

COLORS = {"admitted": "#2e7d32", "rejected": "#c62828", "failed": "#6a1b9a", "measured": "#1565c0", "apportioned": "#00838f",
          "estimated": "#ef6c00"}
TICKS = 6


@dataclass
class Series:
    """Per time bucket: decisions by outcome, GPU seconds by kind of figure."""

    start: float
    width: float
    admitted: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    gpu: dict[str, list[float]] = field(default_factory=dict)  # kind (measured / apportioned / estimated) -> per bucket

    @property
    def end(self) -> float:
        return self.start + self.width * len(self.admitted)


def e(text: object) -> str:
    return html.escape(str(text), quote=True)


def nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * mag:
            return m * mag
    return 10 * mag


def fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def stacked_bars(title: str, rows: Sequence[ReportRow]) -> str:
    """Horizontal bars per group: admitted, rejected, failed."""
    rows = list(rows)[:20]
    bar_h, label_w, w = 18, 150, 570
    h = 30 + bar_h * len(rows) + 8 * len(rows) + 24
    top = nice_max(max((r.decisions for r in rows), default=1))
    scale = (w - label_w - 60) / top
    out = [f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{e(title)}">',
           f'<text x="0" y="16" class="title">{e(title)}</text>']
    y = 30
    for r in rows:
        out.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{e(r.key[:26])}</text>')
        x = float(label_w)
        for kind, n in (("admitted", r.admitted), ("rejected", r.rejected), ("failed", r.failed)):
            if n:
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{n * scale:.1f}" height="{bar_h}" fill="{COLORS[kind]}">'
                           f'<title>{e(r.key)}: {n} {kind}</title></rect>')
                x += n * scale
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{r.decisions}</text>')
        y += bar_h + 8
    out.append(legend(("admitted", "rejected", "failed"), 0, h - 6))
    out.append("</svg>")
    return "".join(out)


def labelled_bars(title: str, items: Sequence[tuple[str, int]], color: str = COLORS["rejected"]) -> str:
    """One bar per (label, count)."""
    bar_h, label_w, w = 18, 330, 1150
    h = 30 + (bar_h + 8) * len(items)
    top = nice_max(max((n for _, n in items), default=1))
    scale = (w - label_w - 60) / top
    out = [f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{e(title)}">',
           f'<text x="0" y="16" class="title">{e(title)}</text>']
    y = 30
    for label, n in items:
        short = label if len(label) <= 52 else label[:51] + "…"
        out.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{e(short)}</text>'
                   f'<rect x="{label_w}" y="{y}" width="{n * scale:.1f}" height="{bar_h}" fill="{color}"><title>{e(label)}: {n}</title></rect>'
                   f'<text x="{label_w + n * scale + 4:.1f}" y="{y + 13}">{n}</text>')
        y += bar_h + 8
    out.append("</svg>")
    return "".join(out)


def time_ticks(start: float, end: float, n: int = TICKS) -> list[tuple[float, str]]:
    """`n` evenly spaced ticks over [start, end] with labels as precise as the span needs:
    the first tick carries the date, later ones only what changes."""
    span = max(end - start, 1e-9)
    if span >= 2 * 86400:
        first, rest = "%Y-%m-%d %H:%M", "%m-%d %H:%M"
    elif span >= 3 * 3600:
        first, rest = "%Y-%m-%d %H:%M", "%H:%M"
    elif span >= 120:
        first, rest = "%Y-%m-%d %H:%M:%S", "%H:%M:%S"
    else:
        first, rest = "%Y-%m-%d %H:%M:%S.%f", "%H:%M:%S.%f"
    out = []
    for i in range(n):
        t = start + span * i / (n - 1)
        label = datetime.fromtimestamp(t, tz=timezone.utc).strftime(first if i == 0 else rest)
        if "%f" in first:
            label = label[:-3]  # milliseconds
        out.append((t, label))
    return out


def line_chart(title: str, series: Series, lines: Sequence[tuple[str, Sequence[float]]], unit: str) -> str:
    """Lines over the time buckets, with a y axis and a labelled UTC time axis."""
    w, h, left, bottom, top_pad = 570, 290, 60, 62, 44
    n = len(lines[0][1])
    top = nice_max(max((max(v, default=0) for _, v in lines), default=0))
    plot_w, plot_h = w - left - 30, h - bottom - top_pad
    y0 = top_pad + plot_h

    def xy(i: float, v: float) -> tuple[float, float]:
        return left + plot_w * i / max(n, 1), top_pad + plot_h * (1 - v / top)

    out = [f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{e(title)}">',
           f'<text x="0" y="16" class="title">{e(title)}</text>']
    for k in range(5):
        v = top * k / 4
        _, y = xy(0, v)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
    out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y0:.1f}" y2="{y0:.1f}" class="axis"/>')
    ticks = time_ticks(series.start, series.end)
    for i, (t, label) in enumerate(ticks):
        x = left + plot_w * (t - series.start) / max(series.end - series.start, 1e-9)
        anchor = "start" if i == 0 else "end" if i == len(ticks) - 1 else "middle"
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top_pad}" y2="{y0 + 5:.1f}" class="grid"/>'
                   f'<text class="tick" x="{x:.1f}" y="{y0 + 18:.1f}" text-anchor="{anchor}">{e(label)}</text>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{y0 + 36:.1f}" text-anchor="middle" class="axis-title">time (UTC), '
               f'{e(fmt(series.width))} s per point</text>'
               f'<text x="{left - 6}" y="{top_pad - 12}" text-anchor="end">{e(unit)}</text>')
    for name, values in lines:
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i + 0.5, v) for i, v in enumerate(values)))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{COLORS[name]}" stroke-width="2"><title>{e(name)}</title></polyline>')
        for i, v in enumerate(values):
            x, y = xy(i + 0.5, v)
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{COLORS[name]}"><title>{e(name)}: {fmt(v)}</title></circle>')
    out.append(legend(tuple(name for name, _ in lines), left, h - 4))
    out.append("</svg>")
    return "".join(out)


def legend(names: Sequence[str], x: float, y: float) -> str:
    out = []
    for name in names:
        out.append(f'<rect x="{x}" y="{y - 10}" width="10" height="10" fill="{COLORS[name]}"/>'
                   f'<text x="{x + 14}" y="{y}">{e(name)}</text>')
        x += 24 + 8 * len(name)
    return "".join(out)
