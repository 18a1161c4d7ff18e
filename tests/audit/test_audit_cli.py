"""`policyc audit verify|report|explain` as an auditor uses them: formats, exit codes, and
one-line errors (never a traceback) for bad input."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest
from audit_helpers import fill
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.cli.main import main

T0 = 1777593600.0  # 2026-05-01T00:00:00Z
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))


@pytest.fixture(scope="module")
def logfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    path = d / "audit.db"
    fill(path, 60, key=KEY, t0=T0)
    (d / "op.pub").write_bytes(KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_ok_with_key_and_json(logfile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "verify", "--log", str(logfile), "--public-key", str(logfile.parent / "op.pub"))
    assert code == 0 and "ok: 66 entries" in out and "signatures valid" in out
    code, out, _ = run(capsys, "verify", "--log", str(logfile), "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["first_bad"] is None and doc["last_checkpoint"]["final"]
    (logfile.parent / "anchor.json").write_text(out)


def test_verify_names_first_bad_entry(logfile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "audit.db"
    bad.write_bytes(logfile.read_bytes())
    with sqlite3.connect(bad) as db:
        db.execute("DELETE FROM entries WHERE seq = 33")
    code, out, _ = run(capsys, "verify", "--log", str(bad))
    assert code == 1 and "first bad entry 33 (deleted)" in out
    code, out, _ = run(capsys, "verify", "--log", str(bad), "--format", "json")
    assert code == 1 and json.loads(out)["first_bad"]["seq"] == 33


def test_verify_with_anchor_catches_full_truncation(logfile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "verify", "--log", str(logfile), "--format", "json")
    anchor = tmp_path / "anchor.json"
    code, out, _ = run(capsys, "verify", "--log", str(logfile), "--format", "json")
    anchor.write_text(out)
    cut = tmp_path / "audit.db"
    cut.write_bytes(logfile.read_bytes())
    with sqlite3.connect(cut) as db:
        db.execute("DELETE FROM entries WHERE seq > 40")
        db.execute("DELETE FROM checkpoints WHERE seq > 40")
    assert run(capsys, "verify", "--log", str(cut))[0] == 0
    code, out, _ = run(capsys, "verify", "--log", str(cut), "--anchor", str(anchor))
    assert code == 1 and "first bad entry 41 (truncated)" in out


def test_report_formats(logfile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "report", "--log", str(logfile), "--by", "tenant", "--from", "2026-05-01", "--to", "2026-05-01T00:00:30Z")
    assert code == 0 and "acme" in out and "globex" in out and out.splitlines()[-2].startswith("total")
    code, out, _ = run(capsys, "report", "--log", str(logfile), "--by", "region", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["region"] for r in rows] == ["eu-central", "us-west", "total"]
    assert int(rows[-1]["decisions"]) == 60
    code, out, _ = run(capsys, "report", "--log", str(logfile), "--by", "model", "--format", "json", "--from", str(T0), "--to", str(T0 + 30))
    doc = json.loads(out)
    assert code == 0 and doc["total"]["decisions"] == 30 and doc["total"]["network_bytes_measured"] > 0
    assert doc["total"]["gpu_seconds_measured"] == 0 and doc["total"]["gpu_seconds_estimated"] > 0


def test_explain(logfile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "--log", str(logfile), "dec-000009")
    assert code == 0
    assert "finance.require_tpm  at policies/finance.contract:12" in out
    assert "estimated by contract" in out and "measured by kernel_flow_counters" in out
    assert "action #11: redirect" in out and "sealed by checkpoint #1" in out and "signed" in out
    code, out, _ = run(capsys, "explain", "--log", str(logfile), "dec-000009", "--format", "json")
    assert code == 0 and json.loads(out)["entry"]["record"]["decision_id"] == "dec-000009"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("verify", "--log", "/nonexistent/audit.db"), "no audit log here"),
        (("report", "--from", "yesterday"), "`yesterday` is not a time"),
        (("report", "--from", "2026-05-02", "--to", "2026-05-01"), "time range is empty"),
        (("verify", "--public-key", "/nonexistent.pub"), "cannot read public key"),
    ],
)
def test_bad_input_is_one_line(logfile: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    args = list(argv) if "--log" in argv else [*argv, "--log", str(logfile)]
    code, out, err = run(capsys, *args)
    assert code == 2 and message in err and "Traceback" not in err and err.count("\n") == 1


def test_not_an_audit_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("hello")
    code, _, err = run(capsys, "verify", "--log", str(junk))
    assert code == 2 and "not an audit log" in err


def test_unknown_decision(logfile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "explain", "--log", str(logfile), "nope")
    assert code == 1 and "`nope` is not in" in err
