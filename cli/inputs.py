"""`-` reads standard input wherever a command takes a path: policy sources, bundles,
request files and models."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from policyc.compiler import load
from policyc.dsl.diagnostics import Diagnostic
from policyc.dsl.source import Source

STDIN = "-"
STDIN_NAME = "<stdin>"


def read_sources(paths: Sequence[str]) -> tuple[list[Source], list[Diagnostic]]:
    """The sources of `paths` in order (a directory: its `.contract` files; `-`: stdin)."""
    sources: list[Source] = []
    diags: list[Diagnostic] = []
    for raw in paths:
        if raw == STDIN:
            src, more = load.read(Path("/dev/stdin"))
            diags.extend(more)
            if src is not None:
                sources.append(Source(STDIN_NAME, src.text))
            continue
        files, more = load.collect([raw])
        diags.extend(more)
        for f in files:
            src, more = load.read(f)
            diags.extend(more)
            if src is not None and all(s.name != src.name for s in sources):
                sources.append(src)
    return sources, diags


def read_text(path: str) -> str:
    """A text file's content (`-`: stdin); OSError / UnicodeDecodeError for the caller to report."""
    if path == STDIN:
        return sys.stdin.read()
    return Path(path).read_text(encoding="utf-8")


def read_bytes(path: str) -> bytes:
    if path == STDIN:
        return sys.stdin.buffer.read()
    return Path(path).read_bytes()
