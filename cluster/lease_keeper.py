"""Keeps one lease alive: refresh every third of its TTL; when it has lapsed anyway (the
store was out of reach longer than the TTL), grant a new one and let the owner put its
keys back (`on_new`). What holds a lease is what keeps its keys alive: stop refreshing
and the store deletes them within the TTL."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from .store import FleetStore, StoreError

log = logging.getLogger("policyc.cluster")


class LeaseKeeper:
    def __init__(self, store: FleetStore, ttl: int, on_new: Callable[[int], Awaitable[None]], what: str) -> None:
        self.store = store
        self.ttl = ttl
        self.on_new = on_new
        self.what = what
        self.lease = 0
        self.renewals = 0
        self._task: asyncio.Task[None] | None = None
        self._paused = asyncio.Event()
        self._paused.set()

    async def start(self) -> int:
        self.lease = await self.store.grant(self.ttl)
        await self.on_new(self.lease)
        self._task = asyncio.get_running_loop().create_task(self._keep())
        return self.lease

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            await self._paused.wait()
            try:
                left = await self.store.refresh(self.lease)
                if left <= 0:
                    log.warning("%s: lease %x lapsed; taking a new one", self.what, self.lease)
                    self.lease = await self.store.grant(self.ttl)
                    self.renewals += 1
                    await self.on_new(self.lease)
            except StoreError as e:
                log.warning("%s: cannot keep lease %x alive yet: %s", self.what, self.lease, e)

    def pause(self) -> None:
        """Stop refreshing, as a stopped process would (tests: a leader frozen past its TTL)."""
        self._paused.clear()

    def resume(self) -> None:
        self._paused.set()

    async def stop(self, *, revoke: bool = True) -> None:
        """Stop refreshing; with `revoke`, delete the keys now rather than at expiry."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if revoke and self.lease:
            try:
                await self.store.revoke(self.lease)
            except StoreError as e:
                log.warning("%s: could not revoke lease %x (its keys lapse within %d s): %s", self.what, self.lease, self.ttl, e)
