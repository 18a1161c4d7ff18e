"""The adversarial corpus: every hostile input gets its clean, located refusal, within bounds.

Each class runs in one subprocess (`corpus.py CLASS`) that limits its own address space
(RLIMIT_AS, the bound per class in `corpus.MEMORY_MIB` and README.md) and each case's
time; it prints one JSON line per case. A case fails when its refusal is not the one the
data file expects, when it was accepted, when anything raised (a traceback), when it
hung past the per-case limit, or when it ran out of the class's memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import CASE_SECONDS, MEMORY_MIB  # noqa: E402

MINIMUM_CASES = {"contract": 200, "bundle": 100, "onnx": 30, "grpc": 30, "cli": 20, "modelserver": 60}


@pytest.mark.parametrize("cls", sorted(MEMORY_MIB))
def test_every_case_of_the_class_is_refused_cleanly(cls: str) -> None:
    # one thread per library pool and two malloc arenas: the address space (what the bound
    # limits) then does not grow with the machine's core count
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    r = subprocess.run([sys.executable, str(HERE / "corpus.py"), cls], capture_output=True, text=True, env=env,
                       timeout=CASE_SECONDS * 9, cwd=HERE.parents[1])
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    hung = [x["case"] for x in results if x["got"].startswith("HANG")]
    assert not hung, f"{cls} case(s) hung: {hung}"
    assert r.returncode == 0, f"the {cls} runner itself failed:\n{r.stderr[-3000:]}"
    assert len(results) >= MINIMUM_CASES[cls], f"only {len(results)} {cls} cases ran"
    failed = [f"{x['case']}: {x['got']}" for x in results if not x["ok"]]
    assert not failed, f"{len(failed)} of {len(results)} {cls} cases failed:\n" + "\n".join(failed)
    names = [x["case"] for x in results]
    assert len(set(names)) == len(names), "case names must be unique"
