"""Every error of a run, sorted by location, with one exit (issue 41): the cases are data
(`tests/compiler/data/five_stages.*`), run through the compiler and through `policyc check`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from policyc.cli.main import main
from policyc.compiler.pipeline import compile_paths, compile_sources
from policyc.dsl.source import Source

DATA = Path(__file__).resolve().parent / "data"


def expected() -> tuple[str, list[dict]]:
    with open(DATA / "five_stages.toml", "rb") as f:
        spec = tomllib.load(f)
    return spec["file"], spec["error"]


def test_five_stages_report_all_their_errors_in_one_run() -> None:
    name, want = expected()
    assert len({e["stage"] for e in want}) >= 5
    result = compile_paths([DATA / name], analyse=False)
    assert result.bundle is None
    got = [(d.code, f"{d.span.line}:{d.span.col}" if d.span else "", d.message, d.help) for d in result.errors]
    assert got == [(e["code"], e["at"], e["message"], e.get("help")) for e in want]


def test_the_cli_prints_them_all_sorted_and_exits_once(tmp_path, monkeypatch, capsys) -> None:
    name, want = expected()
    (tmp_path / name).write_text((DATA / name).read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--format", "json", name]) == 1
    printed = json.loads(capsys.readouterr().out)
    printed = printed if isinstance(printed, list) else printed["diagnostics"]
    errors = [d for d in printed if d["severity"] == "error"]
    assert [d["code"] for d in errors] == [e["code"] for e in want]
    assert main(["check", name]) == 1
    text = capsys.readouterr()
    assert f"{len(want)} errors" in text.out + text.err


def test_an_unknown_unit_is_named_where_it_stands_and_the_rest_still_checks() -> None:
    text = (DATA / "five_stages.contract").read_text(encoding="utf-8")
    text = text.replace("  slo { latency: <= 200 ms }", "  slo { latency: <= 200 msec  allowance: 3 blah }")
    result = compile_sources([Source("u.contract", text)], analyse=False)
    units = [(d.span.line, d.span.col, d.message, d.help) for d in result.errors if d.code == "E109"]
    assert units[0] == (8, 17, "unknown unit `sec`", "did you mean `s`?")
    assert units[1] == (14, 25, "unknown unit `msec`", "did you mean `ms`?")
    assert units[2][:3] == (14, 44, "unknown unit `blah`") and "ms" in (units[2][3] or "")
    # the blanked unit does not echo as "a plain number" beside it
    assert not [d for d in result.errors if d.code != "E109" and d.span and d.span.line == 14]
    assert {"E201", "E310", "E402", "E414"} <= {d.code for d in result.errors}


def test_a_syntax_error_still_holds_back_the_stages_that_would_echo_it() -> None:
    """A file that does not parse lowers to nothing: resolving names against it would only
    report its declarations as unknown, so those stages wait (the other files still lower)."""
    broken = "contract a version \"1\" {\n  compute {\n"
    rule = "policy p {\n  rule r { when: has(request.nope)  require: tpm }\n}\n"
    result = compile_sources([Source("a.contract", broken), Source("b.contract", rule)], analyse=False)
    assert [d.code for d in result.errors] == ["E102"]
