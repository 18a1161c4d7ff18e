"""The bundle for `policies/`, fixed per pass: one golden file for what each pass of the
compiler contributes (`tests/golden/<pass>.json`), so a change shows up in the file of the
pass that made it. Regenerate after an intended change with `UPDATE_GOLDEN=1` and review
the diff like code; expected *errors* are never regenerated (`tests/fixtures/`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from policyc.compiler import bundle_io
from policyc.compiler.bundle import SCHEMA_VERSION, Bundle
from policyc.compiler.pipeline import compile_paths

GOLDEN = Path("tests/golden")


def by_pass(bundle: Bundle) -> dict[str, object]:
    """The bundle's JSON split by the pass that writes each part (every field once)."""
    data = json.loads(bundle_io.dumps(bundle))
    contracts = data.pop("contracts")
    shares = {c["name"]: c.pop("gpu_shares") for c in contracts}
    out = {
        "contracts": contracts,  # compiler/contracts.py
        "catalog": data.pop("gpu_catalog"),  # compiler/catalog.py
        "requests": {"headers": data.pop("headers"), "tenants": data.pop("tenants")},  # compiler/requests.py
        "rules": data.pop("rules"),  # compiler/rules.py
        "breakers": data.pop("breakers"),  # compiler/breakers.py
        "plan": {"index_plan": data.pop("index_plan"), "latency_targets": data.pop("latency_targets")},  # the plan stage
        "analyse": {"gpu_shares": shares, "warnings": data.pop("warnings")},  # solver/analyse.py
        "emit": data,  # schema, compiler version, content hash, signature
    }
    return out


REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def compiled():
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        result = compile_paths(["policies"])
    finally:
        os.chdir(cwd)
    assert result.ok, [str(d) for d in result.errors]
    return result.bundle


@pytest.mark.parametrize("name", ["contracts", "catalog", "requests", "rules", "breakers", "plan", "analyse", "emit"])
def test_pass_output_matches_its_golden(repo, compiled, name):
    text = json.dumps(by_pass(compiled)[name], indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    golden = repo / GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"the `{name}` pass's output changed: review, then UPDATE_GOLDEN=1"


def test_the_passes_cover_the_whole_bundle(compiled):
    """Reassembled from the per-pass parts, the bundle is the compiled one, byte for byte."""
    parts = by_pass(compiled)
    shares = parts["analyse"]["gpu_shares"]
    data = dict(parts["emit"])
    data.update(contracts=[dict(c, gpu_shares=shares[c["name"]]) for c in parts["contracts"]],
                gpu_catalog=parts["catalog"], rules=parts["rules"], breakers=parts["breakers"],
                warnings=parts["analyse"]["warnings"], **parts["requests"], **parts["plan"])
    assert bundle_io.loads(json.dumps(data)) == compiled


def test_compiling_twice_gives_the_same_bytes(repo, monkeypatch):
    monkeypatch.chdir(repo)
    a = bundle_io.canonical_bytes(compile_paths(["policies"]).bundle)
    b = bundle_io.canonical_bytes(compile_paths(["policies"]).bundle)
    assert a == b


def test_golden_bundle_is_current_schema(repo):
    emit = json.loads((repo / GOLDEN / "emit.json").read_text(encoding="utf-8"))
    assert emit["schema_version"] == SCHEMA_VERSION
    assert emit["content_hash"].startswith("sha256:")
