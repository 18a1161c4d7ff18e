"""The JSON Schemas in `schemas/` are what the pydantic models give (regenerate with
`python -m policyc.lsp.schemas`), and a real validator (jsonschema) accepts a compiled
bundle and the shipped test file, and refuses a case without `admitted`."""

from __future__ import annotations

import json
import tomllib

import jsonschema

from policy_text import REPO

from policyc.compiler import bundle_io
from policyc.compiler.pipeline import compile_paths
from policyc.lsp import schemas


def test_committed_schemas_are_current() -> None:
    assert schemas.main(["--check", str(REPO / "schemas")]) == 0


def test_a_bundle_and_a_test_file_validate_and_a_broken_case_does_not() -> None:
    made = schemas.schemas()
    bundle = json.loads(bundle_io.dumps(compile_paths([REPO / "policies"]).bundle))
    jsonschema.Draft202012Validator(made["bundle.schema.json"]).validate(bundle)
    with open(REPO / "policies" / "tests" / "routing_test.toml", "rb") as f:
        tests = tomllib.load(f)
    v = jsonschema.Draft202012Validator(made["test-file.schema.json"])
    v.validate(tests)
    del tests["case"][1]["admitted"]
    errors = list(v.iter_errors(tests))
    assert errors and any("admitted" in e.message for e in errors)
