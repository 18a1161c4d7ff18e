"""Readiness apart from liveness, reported through the standard gRPC health service.

Liveness (`liveness`) says the process serves RPCs at all: SERVING from start to shutdown.
Readiness (`readiness`, the overall `""` and the decision service's own name) says a
balancer may send decisions here: every named check passes — the bundle is loaded, the
topology snapshot is fresh, the registry is warm. Until then, and whenever a check fails
later (a stalled refresher), those names report NOT_SERVING, so Kubernetes' gRPC probes and
Envoy's health checks hold traffic back instead of sending it to a server that would
reject or mis-place it. Other parts add their own checks (`add`), e.g. the fleet's first
sync from etcd.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from grpc_health.v1 import health, health_pb2

log = logging.getLogger("policyc.server")

LIVENESS = "liveness"
READINESS = "readiness"
Check = Callable[[], "str | None"]  # None when ready, else the reason


class Readiness:
    """Named checks, evaluated every `interval` seconds on the serving loop; the health
    servicer's statuses follow their verdict."""

    def __init__(self, servicer: health.aio.HealthServicer, ready_names: tuple[str, ...], interval: float = 0.5) -> None:
        self.servicer = servicer
        self.ready_names = (READINESS, *ready_names)
        self.interval = interval
        self.checks: dict[str, Check] = {}
        self.ready: bool | None = None
        self.reasons: list[str] = []
        self._task: asyncio.Task[None] | None = None

    def add(self, name: str, check: Check) -> None:
        self.checks[name] = check

    def evaluate(self) -> list[str]:
        """The failing checks as `name: reason` (empty: ready)."""
        out = []
        for name, check in self.checks.items():
            try:
                why = check()
            except Exception as e:  # noqa: BLE001 - a broken check means not ready, never a crash
                why = f"check failed: {type(e).__name__}: {e}"
            if why:
                out.append(f"{name}: {why}")
        return out

    async def update(self) -> bool:
        reasons = self.evaluate()
        ready = not reasons
        if ready != self.ready:
            status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in self.ready_names:
                await self.servicer.set(name, status)
            if ready:
                log.info("ready")
            elif self.ready is not None:
                log.warning("not ready: %s", "; ".join(reasons))
        self.ready, self.reasons = ready, reasons
        return ready

    async def start(self) -> None:
        """Liveness SERVING now; readiness as the checks say, then re-checked every interval."""
        await self.servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self.update()
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="policyc-readiness")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.update()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
