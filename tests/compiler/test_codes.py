"""Every diagnostic code the product reports is listed, once, in `policyc.compiler.codes`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from policyc.compiler.codes import CODES, describe

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("dsl", "compiler", "solver", "matcher", "placer", "server", "enforcer", "audit", "onnxgate", "cli",
           "gateway", "cluster", "modelserver", "client", "demo")
CODE = re.compile(r"[EW][0-9]{3}")


def codes_in_source() -> dict[str, str]:
    found: dict[str, str] = {}
    for area in PRODUCT:
        for p in (ROOT / area).rglob("*.py"):
            if p.name == "codes.py" or "_pb2" in p.name:
                continue
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE.fullmatch(node.value):
                    found.setdefault(node.value, str(p.relative_to(ROOT)))
    return found


def test_every_reported_code_is_listed() -> None:
    found = codes_in_source()
    assert len(found) > 60
    missing = {c: f for c, f in found.items() if c not in CODES}
    assert not missing, f"codes reported but not listed in compiler/codes.py: {missing}"


def test_codes_are_grouped_by_stage_and_described() -> None:
    assert all(CODE.fullmatch(c) for c in CODES)
    assert all(text and text == text.strip() and not text.endswith(".") for text in CODES.values())
    assert describe("E703") == CODES["E703"] and "unknown" in describe("E999")
