"""Compiling what the user named (paths, directories, `-` for stdin), with progress on a
terminal: shared by `check`, `compile` and `test`."""

from __future__ import annotations

from typing import Sequence

from policyc.compiler.pipeline import CompileResult, compile_sources

from .inputs import read_sources
from .progress import progress


def compile_inputs(paths: Sequence[str], *, analyse: bool = True) -> CompileResult:
    sources, diags = read_sources(paths)
    if any(d.is_error for d in diags):
        return CompileResult(None, diags, {s.name: s for s in sources})
    with progress(f"compiling {len(sources)} file{'s' * (len(sources) != 1)}"):
        result = compile_sources(sources, analyse=analyse)
    result.diagnostics[:0] = diags
    return result
