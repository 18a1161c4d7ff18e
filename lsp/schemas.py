"""JSON Schemas for the files people and tools write or read beside policies, generated
from the pydantic models that validate them (so they cannot drift): the bundle
(`policyc compile`'s output) and the policy test file (`*_test.toml`, whose TOML maps to
JSON one to one; editors with a TOML schema association, e.g. Taplo/Even Better TOML, use it).

    python -m policyc.lsp.schemas [--check] [DIR]     # writes DIR/bundle.schema.json, test-file.schema.json

`tests/lsp/test_schemas.py` holds the committed files (`schemas/`) equal to what this writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

BASE = "https://policyc.dev/schemas/"


def schemas() -> dict[str, dict[str, Any]]:
    from policyc.compiler.bundle import SCHEMA_VERSION, Bundle
    from policyc.matcher.policy_tests import TestFile

    bundle = Bundle.model_json_schema(mode="serialization")
    bundle.update({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": BASE + "bundle.schema.json",
                   "description": f"A policyc bundle ({SCHEMA_VERSION}): `policyc compile` writes it, `policyc inspect` reads it."})
    tests = TestFile.model_json_schema(mode="validation")
    tests.update({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": BASE + "test-file.schema.json",
                  "description": "A policyc policy test file (`*_test.toml`): a fleet fixture and cases; see `policyc docs`."})
    return {"bundle.schema.json": bundle, "test-file.schema.json": tests}


def text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    out = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "schemas"
    stale = []
    for name, schema in schemas().items():
        path = out / name
        want = text(schema)
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != want:
                stale.append(str(path))
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(want, encoding="utf-8")
    if stale:
        print("stale: " + ", ".join(stale) + " (python -m policyc.lsp.schemas)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
