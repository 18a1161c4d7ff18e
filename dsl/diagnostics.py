"""One diagnostic shape from parser to API.

Every stage reports problems as `Diagnostic`s: a stable code grouped by stage, a severity,
a one-line message in lower case with user input in backticks, the span, an optional help
line and related notes (e.g. the other clauses of an unsat core). Rendering is separate:
`render_text` prints like a compiler (`file:line:col: error[E201]: …`, the source line and a
caret); `render_json` gives the same to machines.

Code groups: E0xx input files, E1xx syntax, E2xx structure, E3xx units and types,
E4xx names and references, E5xx/W5xx solver analyses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping

from .source import Source, Span

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Note:
    span: Span | None
    message: str


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    severity: Severity
    message: str
    span: Span | None
    help: str | None = None
    notes: tuple[Note, ...] = field(default=())

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def location(self) -> str:
        return str(self.span) if self.span else "<input>"

    def to_json(self) -> dict:
        def loc(s: Span | None) -> dict | None:
            return None if s is None else {"file": s.file, "line": s.line, "col": s.col, "end_line": s.end_line, "end_col": s.end_col}

        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "location": loc(self.span),
            "help": self.help,
            "notes": [{"message": n.message, "location": loc(n.span)} for n in self.notes],
        }


def error(code: str, message: str, span: Span | None, help: str | None = None, notes: Iterable[Note] = ()) -> Diagnostic:
    return Diagnostic(code, "error", message, span, help, tuple(notes))


def warning(code: str, message: str, span: Span | None, help: str | None = None, notes: Iterable[Note] = ()) -> Diagnostic:
    return Diagnostic(code, "warning", message, span, help, tuple(notes))


def sort_key(d: Diagnostic) -> tuple:
    s = d.span
    return (s.file, s.line, s.col, d.code) if s else ("", 0, 0, d.code)


def _snippet(span: Span, sources: Mapping[str, Source], gutter: int) -> list[str]:
    src = sources.get(span.file)
    if src is None:
        return []
    text = src.line(span.line)
    if not text and span.line > len(src.text.splitlines()):
        return []
    width = (span.end_col - span.col) if span.end_line == span.line else len(text) - span.col + 1
    pad = " " * gutter
    return [
        f"{span.line:>{gutter}} | {text}",
        f"{pad} | {' ' * (span.col - 1)}{'^' * max(width, 1)}",
    ]


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


def render_json(diags: Iterable[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diags], indent=1, sort_keys=True)


def summary(diags: list[Diagnostic]) -> str:
    e = sum(d.is_error for d in diags)
    w = len(diags) - e
    return f"{e} error{'s' * (e != 1)}, {w} warning{'s' * (w != 1)}"


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A help line suggesting the closest known name, when one is close enough."""
    import difflib

    best = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean `{best[0]}`?" if best else None
