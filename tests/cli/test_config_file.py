"""`--config FILE` / `POLICYC_<COMMAND>_<FLAG>` / flags for serve, gateway and agent run
(cli/config_file.py): precedence, checked values naming their place, `--print-config`, and
a real `policyc serve` started from a config file alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policy_text import REPO

from policyc.cli.main import main


def _conf(tmp_path: Path, text: str) -> str:
    p = tmp_path / "policyc.toml"
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_precedence_flag_over_env_over_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    conf = _conf(tmp_path, '[serve]\nbundle = "b.json"\nport = 50052\nsim-hosts = 8\ntoken = ["operator:s3cret"]\nopen_fleet = true\n')
    assert main(["serve", "--config", conf, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[serve]\n") and 'bundle = "b.json"' in out and "port = 50052" in out and "sim-hosts = 8" in out
    assert "open-fleet = true" in out and "s3cret" not in out and 'token = ["operator:<redacted>"]' in out
    monkeypatch.setenv("POLICYC_SERVE_PORT", "50053")
    monkeypatch.setenv("POLICYC_SERVE_SIM_HOSTS", "16")
    assert main(["serve", "--config", conf, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "port = 50053" in out and "sim-hosts = 16" in out
    assert main(["serve", "--config", conf, "--port", "50054", "--print-config"]) == 0
    assert "port = 50054" in capsys.readouterr().out
    monkeypatch.setenv("POLICYC_CONFIG", conf)
    assert main(["serve", "--print-config"]) == 0
    assert 'bundle = "b.json"' in capsys.readouterr().out


@pytest.mark.parametrize(("text", "env", "said"), [
    ('[serve]\nprot = 1\n', {}, "[serve] prot: no such setting; did you mean `port`?"),
    ('[serve]\nenforcer = "kernal"\n', {}, "[serve] enforcer: `kernal` is not one of auto, kernel, userspace, off for --enforcer"),
    ('[serve]\nport = "http"\n', {}, "[serve] port: invalid value `http` for --port"),
    ('[serve]\nopen-fleet = "maybe"\n', {}, "[serve] open-fleet: expected true or false for --open-fleet"),
    ('[srve]\n', {}, "unknown table [srve]"),
    ('[serve\n', {}, "not valid TOML"),
    ('', {"POLICYC_SERVE_REFRESH": "fast"}, "$POLICYC_SERVE_REFRESH: invalid value `fast` for --refresh"),
])
def test_a_bad_setting_is_one_line_naming_its_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], text: str, env: dict, said: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as e:
        main(["serve", "--config", _conf(tmp_path, text), "--print-config"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and said in err, err


def test_gateway_and_agent_take_their_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = _conf(tmp_path, '[gateway]\nmax-in-flight = 256\n[agent]\nhost = "host-7"\netcd = ["http://127.0.0.1:2379"]\n')
    assert main(["gateway", "--config", conf, "--print-config"]) == 0
    assert "max-in-flight = 256" in capsys.readouterr().out
    assert main(["agent", "run", "--config", conf, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert 'host = "host-7"' in out and 'etcd = ["http://127.0.0.1:2379"]' in out


def test_serve_starts_from_a_config_file_alone(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.json"
    assert main(["compile", str(REPO / "policies"), "-o", str(bundle)]) == 0
    conf = _conf(tmp_path, f'[serve]\nbundle = "{bundle}"\nport = 0\nmetrics-port = 0\nenforcer = "userspace"\n'
                           f'state-dir = "{tmp_path / "state"}"\n')
    proc = subprocess.Popen([sys.executable, "-m", "policyc.cli.main", "serve", "--config", conf], cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        seen = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "listening on" not in seen:
            line = proc.stderr.readline() if proc.stderr else ""
            if not line and proc.poll() is not None:
                break
            seen += line
        assert re.search(r"listening on 127\.0\.0\.1:\d+", seen), seen
    finally:
        proc.terminate()
        proc.wait(timeout=60)
