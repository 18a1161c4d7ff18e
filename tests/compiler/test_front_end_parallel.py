"""The front end split across forked workers gives the same bundle, byte for byte, and the
same diagnostics as one process; declarations cross the process boundary as JSON."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from policyc.compiler import bundle_io, front_end
from policyc.compiler.pipeline import compile_sources
from policyc.dsl.source import Source


# forking happens only in a process with no other thread: these run before any test starts one
pytestmark = pytest.mark.single_threaded


@pytest.fixture(autouse=True)
def _no_other_thread() -> None:
    assert threading.active_count() == 1, f"threads running: {[t.name for t in threading.enumerate()]}"


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


def test_claims_from_both_ends_meet_and_take_every_file_once():
    bounds = multiprocessing.get_context("fork").Array("i", [0, 7])
    order = [front_end._claim(bounds, from_front=k % 3 != 0) for k in range(9)]
    taken = [i for i in order if i is not None]
    assert sorted(taken) == list(range(7)) and order[-2:] == [None, None]
    assert [i for k, i in enumerate(order[:7]) if k % 3 == 0] == [6, 5, 4]


def test_a_worker_that_dies_costs_nothing_but_time(repo, monkeypatch):
    sources = _sources(repo)
    serial = _compile(sources, monkeypatch, False)
    parent, real = os.getpid(), front_end.front_end_file
    claimed_by_worker = multiprocessing.get_context("fork").Value("i", 0)

    def slow_here(src):  # this process dawdles so that the worker claims files too
        if os.getpid() == parent:
            time.sleep(0.2)
        else:
            with claimed_by_worker.get_lock():
                claimed_by_worker.value += 1
        return real(src)

    monkeypatch.setattr(front_end, "front_end_file", slow_here)
    monkeypatch.setattr(front_end, "_pack", lambda units: os._exit(3))  # the worker dies before answering
    monkeypatch.setattr(front_end, "PARALLEL_MIN_BYTES", 0)
    parallel = compile_sources(sources, analyse=False)
    assert claimed_by_worker.value > 0
    assert bundle_io.canonical_bytes(parallel.bundle) == bundle_io.canonical_bytes(serial.bundle)
