"""One diagnostic shape from the parser to the CLI and the gRPC API.

Every stage reports a problem as a `Diagnostic`: a stable code (`policyc.compiler.codes`),
a severity, a one-line message in lower case with user input in backticks, where it is (a
source `Span`, or for a request or registration the `field` it is about, such as a header
name), an optional help line and related notes (e.g. the other clauses of an unsat core).
The CLI prints it like a compiler (`dsl.diagnostics.render_text`), `--format json` prints
`to_json`, the bundle keeps its warnings in this shape, and the gRPC API sends it as a
`google.rpc.Status` whose `ErrorInfo` holds the code and whose `BadRequest` names the field
(`server/rich_status.py`).

Standard library only: the parser, the compiler and the runtime all import it, and the
runtime never imports `dsl/`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from . import meaning

Severity = Literal["error", "warning"]
JsonLocation = dict[str, str | int]


class Span(NamedTuple):
    """Where a piece of policy came from: the file as the user named it (relative to the
    compile root), 1-based line and column, and the end, so a caret can underline the whole
    token. A named tuple: the parser makes one per node, and a tuple is cheap to build."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @staticmethod
    def point(file: str, line: int, col: int, width: int = 1) -> Span:
        return Span(file, line, col, line, col + max(width, 1))


@dataclass(frozen=True, slots=True)
class Note:
    span: Span | None
    message: str


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    severity: Severity
    message: str
    span: Span | None = None
    help: str | None = None
    notes: tuple[Note, ...] = ()
    field: str | None = None  # the request field or header it is about, when there is no span

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def location(self) -> str:
        if self.span is not None:
            return str(self.span)
        return f"`{self.field}`" if self.field else "<input>"

    def __str__(self) -> str:
        return f"{self.location()}: {self.severity}[{self.code}]: {self.message}"

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "location": _location(self.span),
            "help": self.help,
            "notes": [{"message": n.message, "location": _location(n.span)} for n in self.notes],
        }
        if self.field is not None:
            out["field"] = self.field
        return out


def _location(s: Span | None) -> JsonLocation | None:
    if s is None:
        return None
    return {"file": s.file, "line": s.line, "col": s.col, "end_line": s.end_line, "end_col": s.end_col}


def error(code: str, message: str, span: Span | None = None, help: str | None = None, notes: Iterable[Note] = (),
          *, field: str | None = None) -> Diagnostic:
    return Diagnostic(code, "error", message, span, help, tuple(notes), field)


def warning(code: str, message: str, span: Span | None = None, help: str | None = None, notes: Iterable[Note] = (),
            *, field: str | None = None) -> Diagnostic:
    return Diagnostic(code, "warning", message, span, help, tuple(notes), field)


def sort_key(d: Diagnostic) -> tuple[str, int, int, str]:
    s = d.span
    return (s.file, s.line, s.col, d.code) if s else ("", 0, 0, d.code)


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A help line suggesting the closest known name, when one is close enough."""
    best = meaning.did_you_mean(word, choices)
    return f"did you mean `{best}`?" if best else None


def render_json(diags: Iterable[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diags], indent=1, sort_keys=True)


def summary(diags: list[Diagnostic]) -> str:
    e = sum(d.is_error for d in diags)
    w = len(diags) - e
    return f"{e} error{'s' * (e != 1)}, {w} warning{'s' * (w != 1)}"
