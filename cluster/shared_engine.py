"""The decision engine of a replica whose registry is shared: registrations and removals
that arrive by RPC are written to the store before they are answered (so every replica
serves them, and a refused write is an error the caller sees, never a silent local-only
instance) — awaited off the serving loop (`register_shared`, which the service calls when
the engine has it), or waited for by direct callers (`register`); what the store's watch
delivers is applied locally with `apply_*`, without writing back."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Iterable, Protocol

from policyc.matcher import Instance
from policyc.server.engine import DecisionEngine
from policyc.server.errors import ServiceError, Status

from .store import StoreError

WRITE_TIMEOUT = 7.0  # seconds: past the store's own retries through an election (op_timeout 5 s)


class RegistryWriter(Protocol):
    def put_instances(self, items: list[tuple[Instance, float | None]]) -> None: ...

    def delete_instance(self, instance_id: str) -> None: ...

    def put_instances_later(self, items: list[tuple[Instance, float | None]]) -> "Future[None]": ...

    def delete_instance_later(self, instance_id: str) -> "Future[None]": ...


class SharedRegistryEngine(DecisionEngine):
    writer: RegistryWriter | None = None  # set by the replica once its store is connected

    def register(self, instance: Instance, score: float | None = None) -> int:
        size = super().register(instance, score)  # admission first: the store only gets admissible instances
        if self.writer is not None:
            try:
                self.writer.put_instances([(instance, score)])
            except StoreError as e:
                super().deregister(instance.id)
                raise ServiceError(Status.UNAVAILABLE, f"instance `{instance.id}` was not registered: the fleet store "
                                   f"did not take it, so no replica would serve it ({e}); retry") from None
        return size

    def register_many(self, instances: Iterable[Instance], scores: dict[str, float] | None = None) -> int:
        items = list(instances)
        size = super().register_many(items, scores)
        if self.writer is not None:
            given = scores or {}
            try:
                self.writer.put_instances([(i, given.get(i.id)) for i in items])
            except StoreError as e:
                for i in items:
                    super().deregister(i.id)
                raise ServiceError(Status.UNAVAILABLE, f"{len(items)} instance(s) were not registered: the fleet store "
                                   f"did not take them ({e}); retry") from None
        return size

    def deregister(self, instance_id: str) -> int:
        size = super().deregister(instance_id)
        if self.writer is not None:
            try:
                self.writer.delete_instance(instance_id)
            except StoreError as e:
                raise ServiceError(Status.UNAVAILABLE, f"instance `{instance_id}` was removed here but the fleet store did "
                                   f"not take the removal, so other replicas still serve it ({e}); retry") from None
        return size

    # ---------------------------------------------------------------- RPCs, off the loop
    async def register_shared(self, instance: Instance, score: float | None = None) -> int:
        """`RegisterInstance` on a replica: admitted and added here, then written to the
        store while the serving loop keeps deciding (an etcd election delays the answer,
        not the decisions); undone and refused if the store does not take it."""
        size = DecisionEngine.register(self, instance, score)
        if self.writer is None:
            return size
        try:
            await asyncio.wait_for(asyncio.wrap_future(self.writer.put_instances_later([(instance, score)])), WRITE_TIMEOUT)
        except (StoreError, asyncio.TimeoutError) as e:
            if instance.id in self.state.registry:
                DecisionEngine.deregister(self, instance.id)
            raise ServiceError(Status.UNAVAILABLE, f"instance `{instance.id}` was not registered: the fleet store "
                               f"did not take it, so no replica would serve it ({e or 'timed out'}); retry") from None
        return len(self.state.registry)

    async def deregister_shared(self, instance_id: str) -> int:
        size = DecisionEngine.deregister(self, instance_id)
        if self.writer is None:
            return size
        try:
            await asyncio.wait_for(asyncio.wrap_future(self.writer.delete_instance_later(instance_id)), WRITE_TIMEOUT)
        except (StoreError, asyncio.TimeoutError) as e:
            raise ServiceError(Status.UNAVAILABLE, f"instance `{instance_id}` was removed here but the fleet store did "
                               f"not take the removal, so other replicas still serve it ({e or 'timed out'}); retry") from None
        return len(self.state.registry)

    # ---------------------------------------------------------------- from the store
    def apply_register(self, instance: Instance, score: float | None) -> None:
        """An instance the store holds: add it, or replace a different one of that id.
        ServiceError when this replica's bundle does not admit it."""
        reg = self.state.registry
        if instance.id in reg:
            if reg.get(instance.id) == instance:
                return
            DecisionEngine.deregister(self, instance.id)
        DecisionEngine.register(self, instance, score)

    def apply_register_many(self, items: list[tuple[Instance, float | None]]) -> None:
        if items:
            DecisionEngine.register_many(self, [i for i, _ in items], {i.id: s for i, s in items if s is not None})

    def apply_deregister(self, instance_id: str) -> None:
        if instance_id in self.state.registry:
            DecisionEngine.deregister(self, instance_id)
