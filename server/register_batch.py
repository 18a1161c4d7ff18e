"""`RegisterInstances`: many registrations in one call, one result per item.

Each item gets exactly RegisterInstance's checks (the contract given inline or in an ONNX
model, the endpoint rules, the fields, the facts against the topology, the score); a
refused item is answered in its result (status, message naming the item, field, code) and
the others go on. The admitted ones are then screened together (admission by the bundle,
ids already registered or given twice: `bulk_registration.screen`) and registered in one
columnar batch (`DecisionEngine.register_batch` → `Registry.add_batch`). On a replica (the
default `policyc serve` keeps its registry in the embedded store) the batch is then stored
as plain puts in transactions of 100 (`SharedRegistryEngine.register_batch_shared`); an item
claiming `tpm` goes one by one through RegisterInstance's ledger write, since its host is
attested (challenged) first and the attestation recorded beside it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

from policyc.matcher import Instance
from policyc.matcher.columns import InstanceBatch

from .bulk_registration import Refusal, screen
from .errors import ServiceError, Status
from .proto import pb
from .registration import request_id_of

if TYPE_CHECKING:
    from .service import DecisionService

MAX_ITEMS = 100_000  # items in one call (the message size caps it too)
YIELD_EVERY = 256  # items checked between two turns of the serving loop (~25 ms at ~100 µs an item)


def _refused(iid: str, e: ServiceError) -> "pb.RegisterInstanceResult":
    code = e.diagnostics[0].code if e.diagnostics else ""
    return pb.RegisterInstanceResult(instance_id=iid, registered=False, status=e.status.value, message=e.message,
                                     field=e.field or "", code=code)


def _screened(r: Refusal) -> ServiceError:
    """A batch-screen refusal as RegisterInstance would have raised it."""
    if r.field == "id":
        return ServiceError(Status.ALREADY_EXISTS, f"{r.reason}; use update()", field="id")
    if r.field == "model":
        return ServiceError(Status.NOT_FOUND, r.reason, field="model", code="E720")
    return ServiceError(Status.FAILED_PRECONDITION, r.reason, field=r.field or "deployment", code="E721")


async def register_instances(service: "DecisionService", request: "pb.RegisterInstancesRequest",
                             context: grpc.aio.ServicerContext) -> "pb.RegisterInstancesResponse":
    items = request.instances
    if len(items) > MAX_ITEMS:
        raise ServiceError(Status.INVALID_ARGUMENT, f"{len(items):,} instances in one call; at most {MAX_ITEMS:,}",
                           field="instances")
    bundle = service.engine.state.bundle
    results: list[pb.RegisterInstanceResult | None] = [None] * len(items)
    checked: list[tuple[int, Instance, float | None, tuple[str, ...]]] = []
    for i, item in enumerate(items):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)  # the checks run on the serving loop: let decisions through between slices
        try:
            inst, _, score, unverified = await service._checked_registration(item, bundle)
        except ServiceError as e:
            results[i] = _refused(item.id, e)
        else:
            checked.append((i, inst, score, unverified))
    shared = getattr(service.engine, "register_shared", None)
    batched = checked
    if shared is not None:  # a replica: a `tpm` claim is attested one by one, through the ledger
        rid = request_id_of(context.invocation_metadata())
        batched = [c for c in checked if not c[1].deployment.tpm]
        for i, inst, score, unverified in (c for c in checked if c[1].deployment.tpm):
            try:
                await shared(inst, score, f"{rid}.{i}" if rid else "")
            except ServiceError as e:
                results[i] = _refused(inst.id, e)
            else:
                results[i] = pb.RegisterInstanceResult(instance_id=inst.id, registered=True, unverified_facts=unverified)
    if batched:
        insts = [c[1] for c in batched]
        batch = InstanceBatch.from_instances(insts, {c[1].id: c[2] for c in batched if c[2] is not None})
        reg = service.engine.state.registry
        keep, positions, refused = screen(batch, bundle, taken=[iid for iid in batch.ids if iid in reg],
                                          wheres=[f"item {c[0] + 1}" for c in batched])
        for r in refused:
            results[batched[r.index][0]] = _refused(r.instance_id, _screened(r))
        stored = getattr(service.engine, "register_batch_shared", None)
        try:
            if stored is not None:
                await stored(keep, [(batched[p][1], batched[p][2]) for p in positions])
            else:
                service.engine.register_batch(keep)
        except ServiceError as e:  # the store did not confirm them: each says so
            for p in positions:
                results[batched[p][0]] = _refused(batched[p][1].id, e)
        else:
            for p in positions:
                i, inst, _, unverified = batched[p]
                results[i] = pb.RegisterInstanceResult(instance_id=inst.id, registered=True, unverified_facts=unverified)
    done = [r for r in results if r is not None]
    assert len(done) == len(items)
    return pb.RegisterInstancesResponse(results=done, registered=sum(r.registered for r in done),
                                        registry_size=len(service.engine.state.registry), bundle_hash=bundle.content_hash)
