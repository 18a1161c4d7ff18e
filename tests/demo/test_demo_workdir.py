"""`policyc demo --workdir out/`, the example in its own --help, runs with the relative
path as given: the demo once handed `out/gateway/picker.sock` to Envoy, which takes only
absolute socket paths, and died with a traceback. Run as a user would, in a subprocess
whose working directory holds `out/`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(660)  # the demo's LLM scene waits for real vLLM to start
def test_demo_with_a_relative_workdir_runs_and_keeps_its_files(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "policyc.cli.main", "demo", "--workdir", "out/"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    text = r.stdout + r.stderr
    assert "Traceback" not in text, text[-3000:]
    assert r.returncode == 0, text[-3000:]
    assert "demo finished" in r.stdout
    out = tmp_path / "out"
    assert (out / "audit.db").is_file()  # kept where the user asked, relative to where they ran it
    pids = [json.loads(f.read_text())["pid"] for f in out.glob("servers/server-*/ready.json")]
    assert pids and not any(os.path.exists(f"/proc/{p}") for p in pids)


def test_demo_workdir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = subprocess.run([sys.executable, "-m", "policyc.cli.main", "demo", "--workdir", "file/out"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("policyc demo: error: --workdir file/out:"), r.stderr
