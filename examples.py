"""Where the example policies live, in a checkout and in an installed wheel alike.

The wheel ships `policies/*.contract` (and the `tests/`, `versions/` and `broken/`
examples) as package data under `policyc/policies`, so `policyc demo` and `policyc test`
find them without the checkout. Everything that needs the examples reads `POLICIES`.
"""

from __future__ import annotations

from pathlib import Path

POLICIES: Path = Path(__file__).resolve().parent / "policies"


class ExamplesMissing(RuntimeError):
    """The installed copy has no example policies (a broken or trimmed install)."""


def policies_dir() -> Path:
    """`POLICIES`, or ExamplesMissing naming the folder and what to do."""
    if not any(POLICIES.glob("*.contract")):
        raise ExamplesMissing(f"{POLICIES}: the example policies are not installed (reinstall policyc from its wheel or sdist)")
    return POLICIES
