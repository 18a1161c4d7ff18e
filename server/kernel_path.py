"""`policyc serve` puts the kernel plane on the data path: TC on the configured interfaces,
the connect hooks on the gateway's cgroup (Envoy runs in it), the backend map in step with
the registry, and the backend breakers fed from what the kernel sees.

One `DataPath` (enforcer/data_path.py) does the attaching; this is its owner in the
decision service. A watcher thread, every `INTERVAL`:
- re-syncs the backend map when the registry or the policy changed (RegisterInstance,
  DeregisterInstance, a reload, a fleet replica's registration, a registry restored at
  start): each instance with an endpoint, its quarantine target the one
  `enforcer.backup_choice` chooses (the picker's retry target);
- hands the kernel's per-backend stream outcomes, window by window, to the guardian's
  backend rules (`enforcer.backend_health`): a rule's quarantine then makes the gateway's new
  connections to that model server land on its backup, in the kernel;
- releases expired quarantines (`Guardian.tick`: the kernel already ignores them; the
  release is audited).

`stop()` detaches everything (`DataPath.detach`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from policyc.enforcer.backend_health import BackendHealth
from policyc.enforcer.backup_choice import quarantine_targets
from policyc.enforcer.data_path import DataPath, DataPathConfig, is_attachable
from policyc.enforcer.guardian import Guardian

from .engine import DecisionEngine

log = logging.getLogger("policyc.server")
INTERVAL = 0.1  # seconds between looks at the registry, the windows and the quarantines


def kernel_plane_loaded(guardian: Guardian | None) -> bool:
    return guardian is not None and is_attachable(guardian.plane)


class KernelPath:
    """`start()` attaches (DataPathError says why not); `stop()` detaches."""

    def __init__(self, guardian: Guardian, engine: DecisionEngine, config: DataPathConfig = DataPathConfig()) -> None:
        from policyc.gateway.pool import Pool  # the registry's instances with an endpoint

        self.guardian = guardian
        self.engine = engine
        self.data_path = DataPath(guardian, config)
        self.pool = Pool(engine)
        self.health = BackendHealth(guardian.observe_backend)
        self._seen: tuple[object, int, object] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], object] | None = None

    def start(self) -> "KernelPath":
        self.data_path.attach()
        try:
            self.sync()
        except Exception:
            self.data_path.detach()
            raise
        self._unsubscribe = self.guardian.plane.subscribe(self.health)  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._run, name="policyc-data-path", daemon=True)
        self._thread.start()
        return self

    def describe(self) -> str:
        dp = self.data_path
        return f"TC on {', '.join(dp.config.interfaces) or 'no interface'}, connect hooks on cgroup {dp.cgroup}"

    def sync(self) -> bool:
        """Re-sync the backend map if the registry or the policy changed; True if it did."""
        seen = (self.engine.state, self.engine.generation, self.guardian.table)  # a new state or table: a reload
        if self._seen is not None and seen[0] is self._seen[0] and seen[1] == self._seen[1] and seen[2] is self._seen[2]:
            return False
        self.data_path.sync(quarantine_targets(self.guardian.table, self.pool))
        self.health.watch(self.data_path.backends())
        self._seen = seen
        return True

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            for step in (self.sync, lambda: self.health.flush(time.monotonic_ns()), self.guardian.tick):
                try:
                    step()
                except Exception:  # noqa: BLE001 - keep watching; say what failed
                    log.exception("data path: a periodic step failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.data_path.detach()
