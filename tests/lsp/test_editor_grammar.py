"""The TextMate grammar (editors/policyc.tmLanguage.json) is valid JSON whose regular
expressions compile, knows exactly the units the language's grammar does, and scopes a
real contract's keys, numbers with units, comments and declarations."""

from __future__ import annotations

import json
import re

from policy_text import REPO

from policyc.dsl.parser import units

GRAMMAR = json.loads((REPO / "editors" / "policyc.tmLanguage.json").read_text(encoding="utf-8"))


def _regexes() -> dict[str, re.Pattern[str]]:
    out = {}
    for name, rule in GRAMMAR["repository"].items():
        text = rule.get("match") or rule.get("begin")
        out[name] = re.compile(text)
    return out


def test_the_grammar_compiles_and_knows_the_languages_units() -> None:
    assert GRAMMAR["scopeName"] == "source.policyc" and GRAMMAR["fileTypes"] == ["contract"]
    quantity = _regexes()["quantity"]
    for u in units():
        m = quantity.fullmatch(f"12 {u}")
        assert m and m.group(2) == u, u
    assert quantity.fullmatch("12 sec") is None  # an unknown unit is not painted as one


def test_a_real_contract_is_scoped() -> None:
    rx = _regexes()
    text = re.sub(r"#.*", "", (REPO / "policies" / "fraud-scorer.contract").read_text(encoding="utf-8"))  # comments come first in the grammar
    assert rx["declaration"].search(text).group(1) == "contract"
    keys = {m.group(1) for m in rx["key"].finditer(text)}
    assert {"flops_per_request", "bandwidth", "burst", "latency"} <= keys
    assert any(m.group(2) == "ms" for m in rx["quantity"].finditer(text))
    assert rx["comment"].search("x: 1  # why").group(0) == "# why"
