"""`policyc` run by a user who cannot search a path's parent directory gets E001 (or its
command's one-line error), never a `PermissionError` traceback: `check`, `fmt` and
`compile` once died in `compiler/load.py` (`is_dir()` → `stat` → EACCES).

Permissions do not bind root, and the tests run as root: each case (cases/cli/
unprivileged.json) runs the real CLI in a subprocess as `nobody` (`setpriv`) on files in a
root-owned directory of mode 0700. Run as another user, the test locks a directory of
its own (mode 0) instead, which binds that user the same way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SPEC = json.loads((HERE / "cases" / "cli" / "unprivileged.json").read_text(encoding="utf-8"))
NOBODY = 65534
POLICYC = [sys.executable, "-m", "policyc.cli.main"]


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, str]]:
    from policyc.compiler import bundle_io
    from policyc.compiler.pipeline import compile_paths
    from policyc.modelserver.model_files import write_model_files

    # not under pytest's own temporary root (mode 0700: nobody could not reach {open} either)
    root = Path(tempfile.mkdtemp(prefix="policyc-unprivileged-", dir="/tmp"))
    locked, opened, out = root / "locked", root / "open", root / "out"
    for d in (locked, opened, out):
        d.mkdir()
    result = compile_paths([str(REPO / "policies" / "fraud-scorer.contract")])
    assert result.bundle is not None
    contract = result.bundle.contract("fraud-scorer")
    assert contract is not None
    for d in (locked, opened):
        shutil.copy(REPO / "policies" / "fraud-scorer.contract", d / "fraud-scorer.contract")
        (d / "bundle.json").write_text(bundle_io.dumps(result.bundle))
        write_model_files(contract, d / "models").full.rename(d / "model.onnx")
    (locked / "sub").mkdir(exist_ok=True)
    root.chmod(0o755)
    opened.chmod(0o755)
    for f in opened.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)
    out.chmod(0o777)
    locked.chmod(0o700 if os.geteuid() == 0 else 0o000)
    try:
        yield {"{locked}": str(locked), "{open}": str(opened), "{out}": str(out)}
    finally:
        locked.chmod(0o700)
        shutil.rmtree(root, ignore_errors=True)


def _as_user() -> list[str]:
    """The command prefix that drops root to nobody (nothing when not root)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    runuser = shutil.which("runuser")
    assert runuser is not None, "running as root needs setpriv or runuser to drop to nobody"
    return [runuser, "-u", "nobody", "--"]


def _fill(text: str, places: dict[str, str]) -> str:
    for k, v in places.items():
        text = text.replace(k, v)
    return text


@pytest.mark.parametrize("case", SPEC["cases"], ids=[c["name"] for c in SPEC["cases"]])
def test_an_unsearchable_path_is_a_clean_error(case: dict, places: dict[str, str]) -> None:  # type: ignore[type-arg]
    argv = [_fill(a, places) for a in case["argv"]]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/"}
    r = subprocess.run(_as_user() + POLICYC + argv, capture_output=True, text=True, timeout=120, cwd="/", env=env)
    text = r.stdout + r.stderr
    assert "Traceback" not in text, text[-3000:]
    assert r.returncode in case["exit"], f"exit {r.returncode}: {text[-1500:]}"
    if "message" in case:
        assert _fill(case["message"], places) in text, text[-1500:]
