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
            src, more = read_stdin_source()
            diags.extend(more)
            if src is not None:
                sources.append(src)
            continue
        files, more = load.collect([raw])
        diags.extend(more)
        for f in files:
            src, more = load.read(f)
            diags.extend(more)
            if src is not None and all(s.name != src.name for s in sources):
                sources.append(src)
    return sources, diags


def read_stdin_source() -> tuple[Source | None, list[Diagnostic]]:
    """stdin as a policy source named `<stdin>`, decoded and refused exactly as a file is."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "stdin.contract"
        f.write_bytes(sys.stdin.buffer.read())
        src, diags = load.read(f)
    return (Source(STDIN_NAME, src.text) if src is not None else None), diags


def read_text(path: str) -> str:
    """A text file's content (`-`: stdin); OSError / UnicodeDecodeError for the caller to report."""
    return read_bytes(path).decode("utf-8")


def read_bytes(path: str) -> bytes:
    """A file's bytes (`-`: stdin), bounded and regular files only (`compiler/bounded_read.py`):
    a FIFO or /dev/zero is refused, never read; OSError for the caller to report."""
    from policyc.compiler import bounded_read
    from policyc.compiler import limits

    if path == STDIN:
        data = sys.stdin.buffer.read(limits.MAX_BUNDLE_BYTES + 1)
        if len(data) > limits.MAX_BUNDLE_BYTES:
            raise OSError(f"standard input is larger than {limits.MAX_BUNDLE_BYTES:,} bytes")
        return data
    try:
        return bounded_read.read_bytes(path, limits.MAX_ONNX_BYTES if path.endswith(".onnx") else limits.MAX_BUNDLE_BYTES)
    except bounded_read.FileRefused as e:
        raise OSError(str(e)) from None
