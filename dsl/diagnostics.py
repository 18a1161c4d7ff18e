"""Diagnostics as the compiler prints them: the one `Diagnostic` shape with its source.

The shape itself (code, severity, message, span or field, help, notes) and its JSON are
`policyc.compiler.diagnostic`'s, shared with the compiler and the runtime; the codes are
listed in `policyc.compiler.codes`. What is here needs the source text: `render_text`
prints like a compiler (`file:line:col: error[E201]: …`, the source line and a caret).

Code groups: E0xx input files, E1xx syntax, E2xx structure, E3xx units and types,
E4xx names and references, E5xx/W5xx solver analyses, E6xx bundle checks, E7xx requests
and registrations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from policyc.compiler.diagnostic import (Diagnostic, Note, Severity, did_you_mean, error, render_json, sort_key, summary,
                                         warning)

from .source import Source, Span

__all__ = ["Diagnostic", "Note", "Severity", "did_you_mean", "error", "render_json", "render_text", "sort_key",
           "summary", "warning"]


def _snippet(span: Span, sources: Mapping[str, Source], gutter: int) -> list[str]:
    src = sources.get(span.file)
    if src is None:
        return []
    text = src.line(span.line)
    if not text and span.line > len(src.text.splitlines()):
        return []
    width = (span.end_col - span.col) if span.end_line == span.line else len(text) - span.col + 1
    col = span.col
    if len(text) > SNIPPET_CHARS:  # a 1 MB line is shown as a window around the column, never whole
        start = max(0, min(col - 1 - SNIPPET_CHARS // 2, len(text) - SNIPPET_CHARS))
        text = ("…" if start else "") + text[start:start + SNIPPET_CHARS] + ("…" if start + SNIPPET_CHARS < len(text) else "")
        col = col - start + (1 if start else 0)
        width = min(width, SNIPPET_CHARS - col + 2)
    pad = " " * gutter
    return [
        f"{span.line:>{gutter}} | {text}",
        f"{pad} | {' ' * (col - 1)}{'^' * max(width, 1)}",
    ]


SNIPPET_CHARS = 160  # the most of one source line a snippet shows


def render_text(diags: Iterable[Diagnostic], sources: Mapping[str, Source]) -> str:
    out: list[str] = []
    for d in diags:
        gutter = max(4, len(str(d.span.line)) if d.span else 0)
        out.append(f"{d.location()}: {d.severity}[{d.code}]: {d.message}")
        if d.span:
            out.extend(_snippet(d.span, sources, gutter))
        for n in d.notes:
            out.append(f"{' ' * gutter} = note: {n.span}: {n.message}" if n.span else f"{' ' * gutter} = note: {n.message}")
            if n.span:
                out.extend(_snippet(n.span, sources, gutter))
        if d.help:
            out.append(f"{' ' * gutter} = help: {d.help}")
    return "\n".join(out) + ("\n" if out else "")
