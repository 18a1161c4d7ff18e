"""The front end split across forked workers gives the same bundle, byte for byte, and the
same diagnostics as one process; declarations cross the process boundary as JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from policyc.compiler import bundle_io, front_end
from policyc.compiler.pipeline import compile_sources
from policyc.dsl.source import Source


def _sources(repo: Path) -> list[Source]:
    return [Source(str(p.relative_to(repo)), p.read_text(encoding="utf-8"))
            for p in sorted((repo / "policies").glob("*.contract"))]


def _compile(sources, monkeypatch, parallel: bool):
    monkeypatch.setattr(front_end, "PARALLEL_MIN_BYTES", 0 if parallel else 10**12)
    unpacked = []
    real_unpack = front_end._unpack
    monkeypatch.setattr(front_end, "_unpack", lambda packed: unpacked.append(1) or real_unpack(packed))
    result = compile_sources(sources, analyse=False)
    assert bool(unpacked) == parallel, "a worker's share came back" if parallel else "no worker ran"
    return result


def test_parallel_front_end_gives_the_same_bundle(repo, monkeypatch):
    sources = _sources(repo)
    assert len(sources) >= 4
    serial, parallel = _compile(sources, monkeypatch, False), _compile(sources, monkeypatch, True)
    assert serial.ok and parallel.ok
    assert bundle_io.canonical_bytes(parallel.bundle) == bundle_io.canonical_bytes(serial.bundle)


def test_parallel_front_end_reports_the_same_errors(repo, monkeypatch):
    sources = _sources(repo)
    broken = Source("broken.contract", sources[0].text.replace("{", "{ ??", 1))
    wrong = Source("wrong.contract", 'contract x version "1" { compute { tokens: 5 GB/s } }\n')
    inputs = [broken, *sources, wrong]
    serial, parallel = _compile(inputs, monkeypatch, False), _compile(inputs, monkeypatch, True)
    assert not parallel.ok
    assert [str(d) for d in parallel.diagnostics] == [str(d) for d in serial.diagnostics]
    assert {d.span.file for d in parallel.errors} >= {"broken.contract", "wrong.contract"}


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_shares_are_contiguous_and_cover_every_file(parts):
    sources = [Source(f"f{i}", "x" * (100 + 37 * i)) for i in range(23)]
    shares = front_end._split(sources, parts)
    assert [s for share in shares for s in share] == sources
    assert all(shares), "every share has work"
