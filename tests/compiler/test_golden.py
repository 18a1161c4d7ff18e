"""The bundle for `policies/` is fixed byte for byte. Regenerate after an intended change
with `UPDATE_GOLDEN=1 make test` and review the diff like code."""

from __future__ import annotations

import os

from policyc.compiler import bundle_io
from policyc.compiler.pipeline import compile_paths

GOLDEN = "tests/golden/policies.bundle.json"


def test_policies_bundle_matches_golden(repo, monkeypatch):
    monkeypatch.chdir(repo)
    result = compile_paths(["policies"])
    assert result.ok, [str(d.message) for d in result.errors]
    text = bundle_io.dumps(result.bundle)
    golden = repo / GOLDEN
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), "bundle bytes changed: review, then UPDATE_GOLDEN=1"


def test_compiling_twice_gives_the_same_bytes(repo, monkeypatch):
    monkeypatch.chdir(repo)
    a = bundle_io.canonical_bytes(compile_paths(["policies"]).bundle)
    b = bundle_io.canonical_bytes(compile_paths(["policies"]).bundle)
    assert a == b


def test_golden_bundle_loads_and_verifies(repo):
    bundle = bundle_io.load(repo / GOLDEN)
    assert {c.name for c in bundle.contracts} >= {"fraud-scorer", "clinical-notes", "recommender", "support-chatbot"}
    assert bundle.content_hash.startswith("sha256:")
