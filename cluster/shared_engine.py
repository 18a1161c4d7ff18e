"""The decision engine of a replica whose registry is shared: registrations and removals
that arrive by RPC are written to the store before they are answered (so every replica
serves them) — awaited off the serving loop (`register_shared`, which the service calls
when the engine has it), or waited for by direct callers (`register`); what the store's
watch delivers is applied locally with `apply_*`, without writing back.

Each write carries a request id (`registry_ledger.py`). A write the store refused is
reported as not done; one it did not confirm (quorum lost, a timeout) is reported as
*unknown* (UNAVAILABLE, ErrorInfo `outcome: unknown` and the request id), never as not
done, because it may still be committed; the replica settles and logs it once the store
answers. A retry with the same request id gets the settled result, never a second write."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import Future
from typing import Iterable, Protocol

from policyc.matcher import Instance
from policyc.matcher.columns import InstanceBatch
from policyc.server.engine import DecisionEngine
from policyc.server.errors import ServiceError, Status
from policyc.server.registration import REQUEST_ID_HEADER, outcome_unknown

from . import instance_codec
from .attestation import AttestedFact
from .registry_ledger import Op, Outcome, RegistryWrite, RequestReused, Unconfirmed
from .store import StoreError, StoreRefused
from .tpm_quote import AttestationError


class RegistryWriter(Protocol):
    write_timeout: float  # the writer gives up (and reports the outcome unknown) after this

    def tpm_problem(self, inst: Instance) -> str: ...

    def host_problem(self, inst: Instance) -> ServiceError | None: ...

    def reports_facts(self, host: str) -> bool: ...

    def attest_later(self, host: str) -> "Future[AttestedFact]": ...

    def attested_facts(self, inst: Instance) -> dict[str, str]: ...

    def can_attest(self, host: str) -> bool: ...

    def write_later(self, w: RegistryWrite) -> "Future[Outcome]": ...

    def write(self, w: RegistryWrite) -> Outcome: ...

    def applied_before_later(self, w: RegistryWrite) -> "Future[bool]": ...

    def reconcile(self) -> None: ...

    def put_instances(self, items: list[tuple[Instance, float | None]]) -> None: ...

    async def store_instances(self, items: list[tuple[Instance, float | None]]) -> None: ...


def new_request_id() -> str:
    return uuid.uuid4().hex


def _registration(instance: Instance, score: float | None, request_id: str,
                  attested: dict[str, str] | None = None) -> RegistryWrite:
    """`attested`: fact -> the attestation key name that vouched for it (the record says so)."""
    value = instance_codec.encode(instance, score, attested or None)
    return RegistryWrite(Op.REGISTER, instance.id, request_id or new_request_id(), value)


class SharedRegistryEngine(DecisionEngine):
    writer: RegistryWriter | None = None  # set by the replica once its store is connected

    # ---------------------------------------------------------------- direct callers (not the loop)
    def register(self, instance: Instance, score: float | None = None) -> int:
        if self.writer is not None and (problem := self.writer.tpm_problem(instance)):
            raise ServiceError(Status.FAILED_PRECONDITION, f"instance `{instance.id}`: {problem}", ("deployment.tpm",),
                               field="deployment.tpm", code="E732")
        if self.writer is not None and (refused := self.writer.host_problem(instance)) is not None:
            raise refused  # a claim its host's own agent contradicts (`host_claims.py`)
        size = super().register(instance, score)  # admission first: the store only gets admissible instances
        if self.writer is not None:
            w = _registration(instance, score, "", self.writer.attested_facts(instance))
            try:
                self.writer.write(w)
            except Exception as e:
                self._undo_register(instance.id, e)
                raise self._refusal(w, e) from None
        return size

    def register_many(self, instances: Iterable[Instance], scores: dict[str, float] | None = None) -> int:
        """Bulk registration (fleets, benchmarks): plain puts of each record, which a retry
        repeats harmlessly; a store that does not confirm them leaves them unknown."""
        items = list(instances)
        size = super().register_many(items, scores)
        if self.writer is not None:
            given = scores or {}
            try:
                self.writer.put_instances([(i, given.get(i.id)) for i in items])
            except StoreError as e:
                for i in items:
                    super().deregister(i.id)
                raise ServiceError(Status.UNAVAILABLE, f"{len(items)} instance(s): the fleet store did not confirm them ({e}); "
                                   "the outcome is unknown (some may take effect): registering them again converges",
                                   code="E730", info={"outcome": "unknown"}) from None
        return size

    def deregister(self, instance_id: str) -> int:
        size = super().deregister(instance_id)
        if self.writer is not None:
            w = RegistryWrite(Op.DEREGISTER, instance_id, new_request_id())
            try:
                self.writer.write(w)
            except Exception as e:
                self.writer.reconcile()
                raise self._refusal(w, e) from None
        return size

    # ---------------------------------------------------------------- RPCs, on the loop
    async def register_shared(self, instance: Instance, score: float | None = None, request_id: str = "") -> int:
        """`RegisterInstance` on a replica: admitted and added here, then written to the
        store while the serving loop keeps deciding (an etcd election delays the answer,
        not the decisions). A retry of an applied request returns its settled result. A `tpm`
        claim is trusted only as attested (`attestation.py`): a host due one is challenged now."""
        if self.writer is not None:
            if (refused := self.writer.host_problem(instance)) is not None:
                raise refused  # a claim its host's own agent contradicts (`host_claims.py`)
            await self._check_attested(instance)
        w = _registration(instance, score, request_id, self.writer.attested_facts(instance) if self.writer else None)
        try:
            size = DecisionEngine.register(self, instance, score)
        except ServiceError as e:
            if self.writer is not None and request_id and e.status is Status.ALREADY_EXISTS and await self._applied_before(w):
                return len(self.state.registry)
            raise
        if self.writer is None:
            return size
        try:
            await self._written(w)
        except Exception as e:
            self._undo_register(instance.id, e)
            raise self._refusal(w, e) from None
        return len(self.state.registry)

    def host_reports(self, host: str) -> bool:
        """Whether `host`'s agent reports facts an instance's claims are judged against (a
        batch registration sends such an instance through `register_shared`)."""
        return self.writer is not None and self.writer.reports_facts(host)

    async def register_batch_shared(self, batch: InstanceBatch, items: list[tuple[Instance, float | None]]) -> int:
        """`RegisterInstances` on a replica, for rows that claim no `tpm` (those go one by
        one through `register_shared`, attested): added here in one columnar batch, then
        stored as plain puts in transactions (a retry repeats them harmlessly, as
        `register_many`'s). A store that does not confirm them takes them out here again:
        the outcome is unknown (some may take effect), and registering them again converges."""
        size = DecisionEngine.register_batch(self, batch)
        if self.writer is None:
            return size
        try:
            await self.writer.store_instances(items)
        except StoreError as e:
            for i, _ in items:
                if i.id in self.state.registry:
                    DecisionEngine.deregister(self, i.id)
            raise ServiceError(Status.UNAVAILABLE, f"{len(items)} instance(s): the fleet store did not confirm them ({e}); "
                               "the outcome is unknown (some may take effect): registering them again converges",
                               code="E730", info={"outcome": "unknown"}) from None
        return len(self.state.registry)

    async def deregister_shared(self, instance_id: str, request_id: str = "") -> int:
        w = RegistryWrite(Op.DEREGISTER, instance_id, request_id or new_request_id())
        try:
            size = DecisionEngine.deregister(self, instance_id)
        except ServiceError as e:
            if self.writer is not None and request_id and e.status is Status.NOT_FOUND and await self._applied_before(w):
                return len(self.state.registry)
            raise
        if self.writer is None:
            return size
        try:
            await self._written(w)
        except Exception as e:
            self.writer.reconcile()  # refused: the store still has it, so this replica serves it again
            raise self._refusal(w, e) from None
        return len(self.state.registry)

    async def _check_attested(self, instance: Instance) -> None:
        assert self.writer is not None
        problem = self.writer.tpm_problem(instance)
        if problem and self.writer.can_attest(instance.deployment.host):  # enrolled, not (freshly) attested: ask now
            try:
                await asyncio.wrap_future(self.writer.attest_later(instance.deployment.host))
            except (AttestationError, StoreError) as e:
                problem = f"{problem}; attesting it now: {e}"
            else:
                problem = self.writer.tpm_problem(instance)
        if problem:
            raise ServiceError(Status.FAILED_PRECONDITION, f"instance `{instance.id}`: {problem}", ("deployment.tpm",),
                               field="deployment.tpm", code="E732")

    async def _written(self, w: RegistryWrite) -> Outcome:
        """The writer bounds the write itself (and settles it when it gives up); the
        shield keeps a caller that goes away from cancelling it halfway."""
        assert self.writer is not None
        fut = asyncio.wrap_future(self.writer.write_later(w))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.writer.write_timeout + 2)
        except asyncio.TimeoutError:
            raise Unconfirmed(w, f"no answer within {self.writer.write_timeout + 2:g} s") from None

    async def _applied_before(self, w: RegistryWrite) -> bool:
        assert self.writer is not None
        try:
            return await asyncio.wrap_future(self.writer.applied_before_later(w))
        except (StoreError, ValueError):
            return False

    def _undo_register(self, instance_id: str, e: Exception) -> None:
        """Not confirmed or refused: this replica does not serve it (if the write lands after
        all, the store's watch brings it back, here and everywhere)."""
        if instance_id in self.state.registry:
            DecisionEngine.deregister(self, instance_id)

    @staticmethod
    def _refusal(w: RegistryWrite, e: Exception) -> ServiceError:
        what = "registration" if w.op is Op.REGISTER else "removal"
        if isinstance(e, RequestReused):
            return ServiceError(Status.INVALID_ARGUMENT, f"instance `{w.instance_id}`: {e}", field=REQUEST_ID_HEADER, code="E731")
        if isinstance(e, StoreRefused):  # answered and refused: known not to be applied
            done = "was not registered" if w.op is Op.REGISTER else "was not removed"
            return ServiceError(Status.UNAVAILABLE, f"instance `{w.instance_id}` {done}: the fleet store refused the write ({e})")
        if isinstance(e, StoreError):  # not confirmed: it may still land
            return outcome_unknown(what, w.instance_id, w.request_id, e.why if isinstance(e, Unconfirmed) else str(e))
        if isinstance(e, ServiceError):
            return e
        return ServiceError(Status.UNAVAILABLE, f"instance `{w.instance_id}`: the {what} failed ({type(e).__name__}: {e})")

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

    def apply_register_batch(self, batch: InstanceBatch) -> None:
        """The store's instances at start, screened (`bulk_registration.screen`), as columns."""
        if len(batch):
            DecisionEngine.register_batch(self, batch)

    def apply_deregister(self, instance_id: str) -> None:
        if instance_id in self.state.registry:
            DecisionEngine.deregister(self, instance_id)
