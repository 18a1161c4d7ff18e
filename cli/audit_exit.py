"""What a serving command says, and how it exits, when its audit log did not close cleanly
(its writer died, or records could not be stored): one place for `policyc serve` and
`policyc gateway`, so both report the same loss the same way (exit 1, `Exit.FAILED`)."""

from __future__ import annotations

from typing import Any


def audit_loss(audit: Any) -> str | None:
    """The line that says what was lost (`audit`: the decision server's audit bridge, or
    None), or None when the log closed cleanly with every record durable."""
    if audit is None or (not audit.lost and audit.log.stopped == "closed"):
        return None
    return (f"stopped, but the audit log {audit.log.path} did not close cleanly ({audit.log.stopped}): "
            f"{audit.lost} record(s) were never made durable, {audit.acknowledged_lost} of them decisions already "
            "acknowledged")
