"""Bad inputs as data: `tests/fixtures/parser.toml` (syntax) and
`tests/fixtures/diagnostics.toml` (structure, units, names). Each case is the whole
input, the code, a fragment of the message and the `file:line:col`; every case is checked
compiled in memory and again through `policyc check --format json`, which must report the
same diagnostic.

Expected errors are written by hand and never regenerated: they are the user-facing
contract. Sources are compiled as `f0.contract`, `f1.contract`, …
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from policy_text import BASE_CONTRACT, compile_text

from policyc.cli.main import main
from policyc.compiler.codes import CODES

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def edit(old: str, new: str, base: str = BASE_CONTRACT) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


def load(name: str) -> list[dict]:
    with open(FIXTURES / f"{name}.toml", "rb") as f:
        return tomllib.load(f)["case"]


CASES = [pytest.param(c, id=f"{name}:{c['id']}") for name in ("parser", "diagnostics") for c in load(name)]


def where(c: dict) -> tuple[str, int, int]:
    file, line, col = c["at"].rsplit(":", 2)
    return file, int(line), int(col)


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case: dict) -> None:
    result = compile_text(*case["sources"])
    assert result.bundle is None, "a bad input must not produce a bundle"
    found = [d for d in result.errors if d.code == case["code"]]
    assert found, f"expected {case['code']}, got {[(d.code, d.message) for d in result.errors]}"
    d = found[0]
    assert case["message"] in d.message, d.message
    assert d.span is not None and (d.span.file, d.span.line, d.span.col) == where(case), str(d.span)


@pytest.mark.parametrize("case", CASES)
def test_the_cli_reports_the_same_diagnostic(case: dict, tmp_path, monkeypatch, capsys) -> None:
    names = [f"f{i}.contract" for i in range(len(case["sources"]))]
    for name, text in zip(names, case["sources"]):
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--format", "json", *names]) == 1
    printed = json.loads(capsys.readouterr().out)
    printed = printed if isinstance(printed, list) else printed["diagnostics"]
    api = [d.to_json() for d in compile_text(*case["sources"]).diagnostics]
    # the same diagnostics, field for field, as the compiler's own
    assert [p for p in printed if p["code"] == case["code"]][:1] == [d for d in api if d["code"] == case["code"]][:1]


def test_fixtures_are_many_and_use_known_codes() -> None:
    assert len(load("parser")) >= 8 and len(load("diagnostics")) >= 45
    assert all(c["code"] in CODES for name in ("parser", "diagnostics") for c in load(name))


def test_every_error_is_reported_not_only_the_first():
    text = edit("bandwidth: >=", "bandwith: >=", edit("tokens: 128", "tokens: 12.5", edit("async_callbacks: no", "async_callbacks: maybe")))
    result = compile_text(text)
    assert {d.code for d in result.errors} >= {"E201", "E314", "E313"}


def test_help_suggests_the_closest_name():
    d = next(d for d in compile_text(edit("bandwidth: >=", "bandwith: >=")).errors if d.code == "E201")
    assert d.help == "did you mean `bandwidth`?"
