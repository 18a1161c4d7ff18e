"""The user-space plane: the kernel plane's semantics without BPF, for machines without root.

Quarantine is a table the process consults when it opens connections (`resolve`); entries
expire exactly as the kernel's do. It cannot see or steer sockets of other code, count
packets, or time HTTP/2 streams, and it says so loudly when created.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence

from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.records import ActionKind, ActionRecord, Outcome
from policyc.enforcer.rule_table import KernelRules

log = logging.getLogger("policyc.enforcer")


class KernelEnforcementOff(RuntimeWarning):
    """Emitted once per user-space plane: the kernel does not enforce anything."""


class UserSpacePlane:
    kernel_enforcement = False

    def __init__(self, audit: Callable[[ActionRecord], None] | None = None, reason: str = "requested") -> None:
        message = f"KERNEL ENFORCEMENT IS OFF ({reason}); the guardian runs on the user-space plane: quarantine applies only to connections opened through it"
        log.warning(message)
        warnings.warn(message, KernelEnforcementOff, stacklevel=2)
        self.reason = reason
        self._audit = audit
        self._lock = threading.Lock()
        self._quarantine: dict[Endpoint, tuple[Endpoint, int, int]] = {}
        self._backends: dict[Endpoint, int] = {}
        self._rules: KernelRules = KernelRules({}, {}, 0)
        self._closers: dict[Endpoint, list[Callable[[], None]]] = {}

    def set_audit(self, audit: Callable[[ActionRecord], None] | None) -> None:
        self._audit = audit

    def _record(self, target: str, detail: str, kind: ActionKind = ActionKind.MAP_CHANGE, rule: int = 0) -> None:
        if self._audit is not None:
            self._audit(ActionRecord(time=time.time(), kind=kind, target=target, rule=self._rules.names.get(rule, ""),
                                     outcome=Outcome.DONE, source="userspace", detail=detail))

    def quarantine(self, backend: Endpoint, backup: Endpoint, rule: int, until_monotonic_ns: int) -> None:
        with self._lock:
            self._quarantine[backend] = (backup, rule, until_monotonic_ns)
        self._record(f"quarantine_set {backend}", f"quarantine_set key={backend} value={backup} arg={until_monotonic_ns}", rule=rule)

    def release(self, backend: Endpoint) -> None:
        with self._lock:
            self._quarantine.pop(backend, None)
        self._record(f"quarantine_del {backend}", f"quarantine_del key={backend}")

    def quarantined(self) -> dict[Endpoint, Endpoint]:
        with self._lock:
            return {k: v[0] for k, v in self._quarantine.items()}

    def resolve(self, target: Endpoint) -> Endpoint:
        """Where a new connection to `target` must go (what connect4/connect6 do in the kernel)."""
        with self._lock:
            entry = self._quarantine.get(target)
        if entry is None:
            return target
        backup, rule, until = entry
        if until and until <= time.monotonic_ns():
            return target
        self._record(str(target), f"connect to {target} rewritten to {backup}", ActionKind.KERNEL_REDIRECT, rule)
        return backup

    def register_backend(self, backend: Endpoint, backend_id: int) -> None:
        with self._lock:
            self._backends[backend] = backend_id
        self._record(f"backend_set {backend}", f"backend_set key={backend} arg={backend_id}")

    def unregister_backend(self, backend: Endpoint) -> None:
        with self._lock:
            self._backends.pop(backend, None)
        self._record(f"backend_del {backend}", f"backend_del key={backend}")

    def apply_rules(self, rules: KernelRules) -> None:
        self._rules = rules
        for idx, ns in rules.budgets_ns.items():
            self._record(f"rule_set {idx}", f"rule_set rule={idx} budget_ns={ns}", rule=idx)

    def on_end_connections(self, backend: Endpoint, closer: Callable[[], None]) -> None:
        """Register how to close a connection this process holds to `backend`."""
        self._closers.setdefault(backend, []).append(closer)

    def end_connections(self, backend: Endpoint) -> int:
        closers = self._closers.pop(backend, [])
        for close in closers:
            close()
        return len(closers)

    def end_connections_many(self, backends: Sequence[Endpoint]) -> dict[Endpoint, int]:
        return {b: self.end_connections(b) for b in dict.fromkeys(backends)}

    def close(self) -> None:
        self._closers.clear()
