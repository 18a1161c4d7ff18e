"""The action record: what the enforcer hands to the audit sink for every act it takes.

One shape for guardian decisions, executor steps and kernel ring-buffer events, so the audit
log (`policyc.audit`) stores them all alike and an auditor can ask "what happened to this
backend" across layers.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict

from policyc.compiler import actions


class ActionKind(str, Enum):
    """What an audit record says the enforcer did: the breaker actions (their words from the
    action table, `compiler/actions.py`), and the enforcer's own acts around them."""

    CANCEL_STREAM = actions.CANCEL_STREAM
    REDIRECT = actions.REDIRECT
    REPORT_ANOMALY = actions.REPORT_ANOMALY
    QUARANTINE = actions.QUARANTINE
    RELEASE = "release"
    END_CONNECTIONS = "end_connections"
    CLASSIFY = "classify"
    SELF_HEAL_STEP = "self_heal_step"
    KERNEL_REDIRECT = "kernel_redirect"
    KERNEL_DROP = "kernel_drop"
    MAP_CHANGE = "map_change"
    STREAM_OVER_BUDGET = "stream_over_budget"
    H2_DESYNC = "h2_desync"


class Outcome(str, Enum):
    DONE = "done"
    DRY_RUN = "dry_run"
    REFUSED = "refused"  # a safety limit (retry budget, quarantine cap) said no
    FAILED = "failed"
    OBSERVED = "observed"


class ActionRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    time: float  # wall clock, seconds since the epoch
    kind: ActionKind
    target: str  # a stream, backend endpoint, GPU key or map entry
    rule: str  # the breaker's name, or "" for kernel events not tied to one
    outcome: Outcome
    dry_run: bool = False
    detail: str = ""
    source: str = "guardian"  # guardian | kernel | userspace | executor
