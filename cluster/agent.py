"""The model server's side of the shared registry: `InstanceAgent` keeps one instance in
the store under a lease that the model server's own process keeps alive.

    agent = InstanceAgent.for_etcd(["127.0.0.1:2379"], instance, ttl=5)
    await agent.start()   # registered on every replica within a watch round trip
    ...
    await agent.stop()    # deregistered now; a process that dies instead is gone within `ttl`

Every replica admits the instance against its own bundle when the watch delivers it (a
replica whose bundle refuses it logs why and keeps it aside until a bundle admits it).
"""

from __future__ import annotations

from typing import Sequence

from policyc.matcher import Instance

from . import instance_codec
from .keys import DEFAULT_PREFIX, Keys
from .lease_keeper import LeaseKeeper
from .store import FleetStore


class InstanceAgent:
    def __init__(self, store: FleetStore, instance: Instance, *, score: float | None = None, ttl: int = 5,
                 keys: Keys = Keys()) -> None:
        self.store = store
        self.instance = instance
        self.key = keys.instance(instance.id)
        self._value = instance_codec.encode(instance, score)
        self._keeper = LeaseKeeper(store, ttl, self._put, f"instance {instance.id}")
        self._owns_store = False

    @classmethod
    def for_etcd(cls, endpoints: Sequence[str], instance: Instance, *, score: float | None = None, ttl: int = 5,
                 prefix: str = DEFAULT_PREFIX) -> "InstanceAgent":
        from .etcd_store import EtcdStore

        agent = cls(EtcdStore(endpoints), instance, score=score, ttl=ttl, keys=Keys(prefix))
        agent._owns_store = True
        return agent

    async def _put(self, lease: int) -> None:
        await self.store.put(self.key, self._value, lease)

    @property
    def lease(self) -> int:
        return self._keeper.lease

    async def start(self) -> int:
        """Register; returns the lease id."""
        if self._owns_store:
            await self.store.connect()
        return await self._keeper.start()

    async def stop(self) -> None:
        await self._keeper.stop(revoke=True)
        if self._owns_store:
            await self.store.close()

    async def crash(self) -> None:
        """Stop keeping the lease alive without revoking it: what a dead model server does."""
        await self._keeper.stop(revoke=False)
        if self._owns_store:
            await self.store.close()
