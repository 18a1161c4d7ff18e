"""The record schema identifiers, in a module with no imports so that the writer process
(which stores bytes and never builds records) can name them without loading pydantic."""

from __future__ import annotations

DECISION_SCHEMA = "policyc.audit.decision/v1"
ACTION_SCHEMA = "policyc.audit.action/v1"
