"""The enforcement plane the guardian talks to, and the choice between kernel and user space.

Both planes keep the same quarantine, backend and rule semantics; only the kernel plane
enforces them on sockets the process does not own. `open_plane` picks the kernel plane where
root and BPF are present and otherwise says loudly that kernel enforcement is off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Protocol

from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.records import ActionRecord
from policyc.enforcer.rule_table import KernelRules

log = logging.getLogger("policyc.enforcer")


class EnforcementPlane(Protocol):
    kernel_enforcement: bool

    def quarantine(self, backend: Endpoint, backup: Endpoint, rule: int, until_monotonic_ns: int) -> None: ...

    def release(self, backend: Endpoint) -> None: ...

    def quarantined(self) -> dict[Endpoint, Endpoint]: ...

    def register_backend(self, backend: Endpoint, backend_id: int) -> None: ...

    def unregister_backend(self, backend: Endpoint) -> None: ...

    def apply_rules(self, rules: KernelRules) -> None: ...

    def end_connections(self, backend: Endpoint) -> int: ...

    def end_connections_many(self, backends: Sequence[Endpoint]) -> dict[Endpoint, int]: ...

    def set_audit(self, audit: Callable[[ActionRecord], None] | None) -> None: ...

    def close(self) -> None: ...


def open_plane(audit: Callable[[ActionRecord], None] | None = None, *, require_kernel: bool = False) -> EnforcementPlane:
    """The kernel plane when it can load; else the user-space plane with a loud warning.

    `require_kernel` (or CI=true in the environment) turns a load failure into an error: a
    CI machine that should enforce in the kernel must not silently fall back.
    """
    from policyc.enforcer.kernel_plane import KernelPlane, KernelPlaneError
    from policyc.enforcer.userspace_plane import UserSpacePlane

    strict = require_kernel or os.environ.get("CI", "").lower() == "true"
    try:
        return KernelPlane(audit)
    except KernelPlaneError as exc:
        if strict:
            raise
        return UserSpacePlane(audit, reason=str(exc))
