"""`policyc.client`: a thin typed client of the decision service (what the CLI itself uses)."""

from __future__ import annotations

from .bearer import operator_channel, with_token
from .decisions import ClientError, DecisionClient, FieldViolation, Unavailable

__all__ = ["ClientError", "DecisionClient", "FieldViolation", "Unavailable", "operator_channel", "with_token"]
