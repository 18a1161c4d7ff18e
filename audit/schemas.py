"""The record schema identifiers, in a module with no imports so that the writer process
(which stores bytes and never builds records) can name them without loading pydantic."""

from __future__ import annotations

from typing import Final

DECISION_SCHEMA: Final = "policyc.audit.decision/v1"  # Final: typed as its literal, as the records' fields are
ACTION_SCHEMA: Final = "policyc.audit.action/v1"
