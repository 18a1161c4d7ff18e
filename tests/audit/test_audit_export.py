"""`policyc audit export` and `verify --record`, with real files and the CLI.

- 100,000 records exported in each format (jsonl, csv, parquet) read back with the same
  count and the same hashes, and every row re-hashes to its own hash from its chain position;
- a record proven alone against an anchor (from the log and from an exported sample), and a
  tampered one refused (edited in the log; edited in the sample);
- Parquet without pyarrow: a one-line hint, not a traceback.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import time
from pathlib import Path

import pytest
from audit_helpers import action, decision, fill
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.audit import export as ex
from policyc.audit.chain import digest
from policyc.audit.log import AuditLog
from policyc.audit.verify import verify
from policyc.cli.main import main

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(21, 53)))
T0 = 1777593600.0
N = 100_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100,000 records (decisions and accounting acts) across two segments."""
    path = tmp_path_factory.mktemp("export") / "audit.db"
    dec = decision(1, t=T0).model_dump_json(exclude_none=True).encode()
    act = action(1, "dec-000001", time=T0).model_dump_json(exclude_none=True).encode()
    with AuditLog.open(path, checkpoint_every=10_000, durability="normal") as log:
        for half in range(2):
            bodies = [(act if i % 10 == 9 else dec).replace(b"dec-000001", f"dec-{half}-{i:06d}".encode())
                      .replace(str(T0).encode(), repr(T0 + half * N / 2 + i).encode(), 1) for i in range(N // 2)]
            for r in log.submit_bodies(bodies)[-1:]:
                r.wait(timeout=300)
            if half == 0:
                log.rotate()
    return path


@pytest.fixture(scope="module")
def hashes(big: Path) -> list[str]:
    out = []
    for f in sorted(big.parent.glob("audit.db.segments/*.db")) + [big]:
        with sqlite3.connect(f) as db:
            out += [bytes(h).hex() for (h,) in db.execute("SELECT hash FROM entries ORDER BY seq")]
    return out


@pytest.mark.parametrize("fmt", ex.FORMATS)
def test_export_round_trips_100k_records(big: Path, hashes: list[str], fmt: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"all.{fmt}"
    t = time.perf_counter()
    assert main(["audit", "export", "--log", str(big), "--format", fmt, "-o", str(out)]) == 0
    took = time.perf_counter() - t
    assert f"exported {N} records" in capsys.readouterr().err
    rows = list(ex.read(out))
    assert len(rows) == N == len(hashes)
    assert [r["hash"] for r in rows] == hashes
    assert all(digest(bytes.fromhex(r["prev_hash"]), r["seq"], r["body"].encode()).hex() == r["hash"] for r in rows)
    assert {r["segment"] for r in rows} == {1, 2}
    acts = [r for r in rows if r["kind"] == "action"]
    assert len(acts) == N // 10 and rows[0]["network_bytes_kind"] == "measured" and rows[0]["gpu_seconds_kind"] == "estimated"
    assert rows[0]["network_bytes_source"] == "kernel_flow_counters"
    print(f"{fmt}: {N} records exported in {took:.2f} s")


def test_export_time_range_and_stdout(big: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "export", "--log", str(big), "--from", str(T0 + 10), "--to", str(T0 + 20)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["seq"] for r in lines] == list(range(11, 21))
    assert main(["audit", "export", "--log", str(big), "--format", "parquet"]) == 2
    assert "-o FILE" in capsys.readouterr().err


def test_parquet_without_pyarrow_is_one_line(big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    real = builtins.__import__

    def no_pyarrow(name: str, *a: object, **k: object) -> object:
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real(name, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    assert main(["audit", "export", "--log", str(big), "--format", "parquet", "-o", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'policyc[parquet]'" in err


@pytest.fixture
def small(tmp_path: Path) -> tuple[Path, Path]:
    path = tmp_path / "audit.db"
    fill(path, 120, key=KEY)
    pub = tmp_path / "op.pub"
    pub.write_bytes(KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path, pub


def test_record_proven_alone_against_an_anchor_and_tampered_one_refused(small: tuple[Path, Path], tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path, pub = small
    anchor = verify(path).last_checkpoint
    assert anchor is not None
    (tmp_path / "anchor.json").write_text(json.dumps(anchor.model_dump(mode="json")))
    a = str(tmp_path / "anchor.json")
    assert main(["audit", "verify", "--log", str(path), "--record", "dec-000042", "--anchor", a]) == 0
    assert "PROVEN" in capsys.readouterr().out
    # a sample taken from an export, proven alone
    assert main(["audit", "export", "--log", str(path), "--format", "csv", "-o", str(tmp_path / "s.csv")]) == 0
    assert main(["audit", "verify", "--log", str(path), "--record", "dec-000042", "--sample", str(tmp_path / "s.csv"),
                 "--anchor", a, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["entries_rehashed"] == anchor.seq - doc["seq"]
    # against the log's signed checkpoint after it, with the key and no anchor
    assert main(["audit", "verify", "--log", str(path), "--record", "dec-000042", "--public-key", str(pub)]) == 0
    assert "signed checkpoint" in capsys.readouterr().out
    # a sample edited after export is refused
    text = (tmp_path / "s.csv").read_text()
    (tmp_path / "s.csv").write_text(text.replace('""outcome"":""admitted""', '""outcome"":""rejected""', 1))
    assert main(["audit", "verify", "--log", str(path), "--record", "dec-000001", "--sample", str(tmp_path / "s.csv"), "--anchor", a]) == 1
    assert "REFUSED" in capsys.readouterr().out
    # a record edited in the log is refused
    with sqlite3.connect(path) as db:
        db.execute("UPDATE entries SET body = CAST(replace(CAST(body AS TEXT), 'h1', 'h9') AS BLOB) WHERE decision_id = 'dec-000042'")
    assert main(["audit", "verify", "--log", str(path), "--record", "dec-000042", "--anchor", a]) == 1
    assert "altered" in capsys.readouterr().out
    # nothing to prove against
    assert main(["audit", "verify", "--log", str(path), "--record", "dec-000043"]) == 2
    assert "--anchor" in capsys.readouterr().err


def test_a_record_in_a_closed_segment_is_proven_against_the_live_anchor(big: Path, tmp_path: Path) -> None:
    from policyc.audit.record_proof import prove_record

    report = verify(big)
    anchor = report.last_checkpoint
    assert report.ok and report.segments == 2 and anchor is not None and anchor.seq == N
    proof = prove_record(big, "seq:49990", anchor=anchor)  # segment 1; the anchor is the live segment's close record
    assert proof.ok and proof.walked == N - 49990, proof.message
    sample = next(r for r in ex.read(_export_csv(big, tmp_path)) if r["seq"] == 49990)
    sample["body"] = sample["body"].replace("dec-0-", "dec-X-")
    refused = prove_record(big, "seq:49990", anchor=anchor, sample=sample)
    assert not refused.ok and "altered" in refused.message


def _export_csv(log: Path, tmp_path: Path) -> Path:
    out = tmp_path / "part.csv"
    ex.export(log, "csv", out, start=T0 + 49_980, end=T0 + 50_000)
    return out
