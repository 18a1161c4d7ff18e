"""Source text and spans.

A span is where a piece of policy came from: file (as the user named it, relative to the
compile root), 1-based line and column, and the end position so a caret can underline the
whole token. Spans are excluded from AST equality (see `ast.py`), so two files that differ
only in layout compare equal. `Span` itself lives in `policyc.compiler.diagnostic`, the one
diagnostic shape every stage shares (a named tuple: the parser makes one per node, and a
tuple is built about three times faster than a frozen dataclass).
"""

from __future__ import annotations

from dataclasses import dataclass

from policyc.compiler.diagnostic import Span

__all__ = ["Source", "Span"]


@dataclass(frozen=True, slots=True)
class Source:
    """One file's text under the name diagnostics show for it."""

    name: str
    text: str

    def line(self, n: int) -> str:
        lines = self.text.splitlines()
        return lines[n - 1] if 1 <= n <= len(lines) else ""
