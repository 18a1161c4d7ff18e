"""Source text and spans.

A span is where a piece of policy came from: file (as the user named it, relative to the
compile root), 1-based line and column, and the end position so a caret can underline the
whole token. Spans are excluded from AST equality (see `ast.py`), so two files that differ
only in layout compare equal. A span is a named tuple rather than a frozen dataclass: the
parser makes one per node, and a tuple is built about three times faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Span(NamedTuple):
    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @staticmethod
    def point(file: str, line: int, col: int, width: int = 1) -> "Span":
        return Span(file, line, col, line, col + max(width, 1))


@dataclass(frozen=True, slots=True)
class Source:
    """One file's text under the name diagnostics show for it."""

    name: str
    text: str

    def line(self, n: int) -> str:
        lines = self.text.splitlines()
        return lines[n - 1] if 1 <= n <= len(lines) else ""
