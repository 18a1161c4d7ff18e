"""A non-editable install works: the wheel carries the grammar, the BPF source, the
.proto and its generated stubs, and the installed `policyc` compiles the shipped policies without the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from policy_text import REPO


def test_wheel_ships_data_and_installed_cli_compiles(tmp_path: Path) -> None:
    # Build from a copy of the tracked files, so no stale `build/` or untracked file leaks in.
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("policyc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("policyc/grammar.lark", "policyc/enforcer/kernel/enforcer.bpf.c", "policyc/server/decision.proto",
                 "policyc/server/decision_pb2.py", "policyc/server/decision_pb2_grpc.py",
                 "policyc/dsl/parser.py", "policyc/cli/main.py"):
        assert data in names, data
    assert not any(n.startswith(("policyc/tests/", "policyc/benchmarks/", "policyc/policies/")) for n in names)

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    # Run from an empty directory with only the installed copy ahead of the venv's editable one.
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "import policyc, sys; print(policyc.__file__); sys.exit(__import__('policyc.cli.main', fromlist=['main']).main(sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-c", code, "check", str(REPO / "policies")], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert str(target) in out.stdout.splitlines()[0], "the installed copy, not the checkout, was imported"
    assert "ok: 5 contracts" in out.stdout
    # the installed copy carries its gRPC stubs: the service module imports without generating anything
    stubs = subprocess.run([sys.executable, "-c", "import policyc.server.proto as p; print(p.pb.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True, timeout=120)
    assert stubs.returncode == 0 and str(target) in stubs.stdout, stubs.stderr
