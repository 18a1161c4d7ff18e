"""A broken `*_test.toml` is reported like a broken contract (issue 41): every problem at
`file:line:col` with the source line and a caret, E8xx codes, cases counted from 1 and
named; the cases are data (`tests/compiler/data/bad_test_files.toml`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from policyc.cli.cmd_test import render_test_file_error
from policyc.cli.main import main
from policyc.compiler.codes import CODES
from policyc.matcher.policy_tests import TestFileError as BrokenTestFile, load

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[2]


def cases() -> list[dict]:
    with open(DATA / "bad_test_files.toml", "rb") as f:
        return tomllib.load(f)["file"]


@pytest.mark.parametrize("case", cases(), ids=lambda c: c["id"])
def test_a_bad_test_file_gives_located_diagnostics(case: dict, tmp_path: Path) -> None:
    path = tmp_path / "t_test.toml"
    path.write_text(case["text"], encoding="utf-8")
    with pytest.raises(BrokenTestFile) as e:
        load(path)
    text = render_test_file_error(e.value)
    heads = [line.removeprefix(f"{path.as_posix()}:") for line in text.splitlines() if ": error[E" in line]
    assert heads == case["expect"], text
    for h in case["help"]:
        assert f"= help: {h}" in text, text
    assert "Field required" not in text and "problem(s)" not in text
    assert all(line.split("error[", 1)[1][:4] in CODES for line in heads)


def test_policyc_test_prints_them_once_each_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad_test.toml"
    bad.write_text(cases()[0]["text"], encoding="utf-8")
    assert main(["test", str(REPO / "policies"), "--tests", str(bad)]) == 1
    out = capsys.readouterr().out
    assert out.count("error[E802]") == 4 and "error: " not in out.split("error[E802]", 1)[0], out
    assert "12 | admited = true" in out and "| ^^^^^^^" in out, out
