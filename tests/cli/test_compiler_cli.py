"""`policyc check / compile / fmt / inspect / keygen` as a user runs them: exit codes
0 ok, 1 policy errors, 2 usage errors; diagnostics as text (file:line:col, source line,
caret) or JSON; no traceback for any input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from policy_text import BASE_CONTRACT, REPO


def policyc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "policyc.cli.main", *args], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    f = tmp_path / "m.contract"
    f.write_text(BASE_CONTRACT.replace("bandwidth: >= 80 GB/s", "bandwidth: >= 80 ms").replace("tokens: 128", "tokens: 12.5"))
    return f


def test_check_ok():
    r = policyc("check", "policies")
    assert r.returncode == 0, r.stderr
    assert "ok: 5 contracts" in r.stdout


def test_check_reports_every_error_like_a_compiler(broken: Path):
    r = policyc("check", str(broken))
    assert r.returncode == 1
    assert "m.contract:4:13: error[E314]: `tokens` expects a whole number" in r.stderr
    assert "m.contract:7:19: error[E303]: `bandwidth` expects a bandwidth" in r.stderr
    assert "   7 |     bandwidth: >= 80 ms" in r.stderr
    assert "     |                   ^^^^^" in r.stderr
    assert "2 errors, 0 warnings" in r.stderr
    assert "Traceback" not in r.stderr


def test_check_json(broken: Path):
    r = policyc("check", "--format", "json", str(broken))
    assert r.returncode == 1
    diags = json.loads(r.stdout)
    assert [(d["code"], d["location"]["line"], d["location"]["col"]) for d in diags] == [("E314", 4, 13), ("E303", 7, 19)]


def test_usage_errors_exit_2(tmp_path: Path):
    assert policyc("check").returncode == 2
    assert policyc("frobnicate").returncode == 2
    r = policyc("check", str(tmp_path / "absent"))
    assert r.returncode == 1 and "no such file or directory" in r.stderr


def test_not_utf8(tmp_path: Path):
    f = tmp_path / "bin.contract"
    f.write_bytes(b"contract x {\n  \xff\xfe\n}\n")
    r = policyc("check", str(f))
    assert r.returncode == 1
    assert "bin.contract:2:3: error[E002]: " in r.stderr and "not UTF-8" in r.stderr


def test_compile_sign_and_inspect(tmp_path: Path):
    assert policyc("keygen", str(tmp_path / "k")).returncode == 0
    out = tmp_path / "b.json"
    r = policyc("compile", "policies", "-o", str(out), "--sign", str(tmp_path / "k.key"))
    assert r.returncode == 0, r.stderr
    assert "signed" in r.stdout
    r = policyc("inspect", str(out), "--public-key", str(tmp_path / "k.pub"))
    assert r.returncode == 0, r.stderr
    assert "signature: ed25519" in r.stdout and "fraud-scorer 2.3.0" in r.stdout
    assert "GPU share:" in r.stdout and "L4 infeasible (architecture)" in r.stdout
    # another key
    policyc("keygen", str(tmp_path / "other"))
    r = policyc("inspect", str(out), "--public-key", str(tmp_path / "other.pub"))
    assert r.returncode == 1 and "signature does not verify" in r.stderr
    # tampered
    data = json.loads(out.read_text())
    data["rules"] = data["rules"][1:]
    out.write_text(json.dumps(data))
    r = policyc("inspect", str(out))
    assert r.returncode == 1 and "does not match its hash" in r.stderr and "Traceback" not in r.stderr


def test_compile_refuses_bad_key(tmp_path: Path):
    (tmp_path / "bad.key").write_text("not a key")
    r = policyc("compile", "policies", "-o", str(tmp_path / "b.json"), "--sign", str(tmp_path / "bad.key"))
    assert r.returncode == 2 and "not an ed25519 private key" in r.stderr


def test_fmt_check_and_rewrite(tmp_path: Path):
    f = tmp_path / "m.contract"
    f.write_text(BASE_CONTRACT.replace("  memory {\n    bandwidth: >= 80 GB/s\n    burst: <= 200 ms\n  }",
                                       "  memory { bandwidth: >=80 GB/s   burst:<=200 ms }"))
    r = policyc("fmt", "--check", "--diff", str(f))
    assert r.returncode == 1 and "would reformat" in r.stdout and "+    burst: <= 200 ms" in r.stdout
    r = policyc("fmt", str(f))  # prints, changes nothing
    assert r.returncode == 0 and r.stdout == BASE_CONTRACT and f.read_text() != BASE_CONTRACT
    assert policyc("fmt", "-w", str(f)).returncode == 0
    assert f.read_text() == BASE_CONTRACT
    assert policyc("fmt", "--check", str(f)).returncode == 0


def test_shipped_policies_are_formatted():
    assert policyc("fmt", "--check", "policies").returncode == 0
