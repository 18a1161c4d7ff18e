"""Printing diagnostics the way a compiler does (or as JSON for machines)."""

from __future__ import annotations

import sys
from typing import Mapping

from policyc.dsl.diagnostics import Diagnostic, render_json, render_text, summary
from policyc.dsl.source import Source


def add_format_flag(p) -> None:
    p.add_argument("--format", choices=("text", "json"), default="text", help="diagnostics as text (default) or JSON")


def print_diagnostics(diags: list[Diagnostic], sources: Mapping[str, Source], fmt: str) -> None:
    if fmt == "json":
        print(render_json(diags))
        return
    if diags:
        sys.stderr.write(render_text(diags, sources))
        sys.stderr.write(summary(diags) + "\n")
