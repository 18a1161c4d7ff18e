"""`RegisterInstances`: many registrations in one call, one result per item.

Each item gets exactly RegisterInstance's checks (the contract given inline or in an ONNX
model, the endpoint rules, the fields, the facts against the topology, the score), run
column by column (`register_columns.py`: an item any check flags is checked one by one, so
its refusal is RegisterInstance's); a refused item is answered in its result (status,
message naming the item, field, code) and the others go on. The admitted ones are then screened together (admission by the bundle,
ids already registered or given twice: `bulk_registration.screen`) and registered in one
columnar batch (`DecisionEngine.register_batch` → `Registry.add_batch`). On a replica (the
default `policyc serve` keeps its registry in the embedded store) the batch is then stored
as plain puts in transactions of 100 (`SharedRegistryEngine.register_batch_shared`); an item
claiming `tpm` goes one by one through RegisterInstance's ledger write, since its host is
attested (challenged) first and the attestation recorded beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from .bulk_registration import Refusal, screen, subset
from .errors import ServiceError, Status
from .proto import pb
from .register_columns import check_items
from .registration import request_id_of

if TYPE_CHECKING:
    from .service import DecisionService

MAX_ITEMS = 100_000  # items in one call (the message size caps it too)


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
    got = await check_items(service, items, bundle)  # RegisterInstance's checks, column by column
    for i, e in got.refused.items():
        results[i] = _refused(items[i].id, e)
    shared = getattr(service.engine, "register_shared", None)
    rows: list[int] = list(range(len(got.batch)))
    if shared is not None:  # a replica: a `tpm` claim is attested one by one, through the ledger, and so is an
        rid = request_id_of(context.invocation_metadata())  # instance whose host's agent reports facts to judge it by
        tpm, hosts = got.batch.flags["tpm"], got.batch.strs["host"]
        reported = getattr(service.engine, "host_reports", None)
        single = {r for r in rows if tpm[r] or (reported is not None and reported(hosts[r]))}
        for r in sorted(single):
            i, inst = got.items[r], got.batch.instance(r)
            try:
                await shared(inst, got.batch.scores[r] if got.batch.scores else None, f"{rid}.{i}" if rid else "")
            except ServiceError as e:
                results[i] = _refused(inst.id, e)
            else:
                results[i] = pb.RegisterInstanceResult(instance_id=inst.id, registered=True,
                                                       unverified_facts=got.unverified[r])
        rows = [r for r in rows if r not in single]
    batched = subset(got.batch, rows)
    where = [got.items[r] for r in rows]  # item index of each batched row
    unverified = [got.unverified[r] for r in rows]
    if len(batched):
        reg = service.engine.state.registry
        keep, positions, refused = screen(batched, bundle, taken=[iid for iid in batched.ids if iid in reg],
                                          wheres=[f"item {i + 1}" for i in where])
        for no in refused:
            results[where[no.index]] = _refused(no.instance_id, _screened(no))
        stored = getattr(service.engine, "register_batch_shared", None)
        try:
            if stored is not None:
                scores = keep.scores
                await stored(keep, [(keep.instance(k), scores[k] if scores else None) for k in range(len(keep))])
            else:
                service.engine.register_batch(keep)
        except ServiceError as e:  # the store did not confirm them: each says so
            for p in positions:
                results[where[p]] = _refused(batched.ids[p], e)
        else:
            for p in positions:
                results[where[p]] = pb.RegisterInstanceResult(instance_id=batched.ids[p], registered=True,
                                                              unverified_facts=unverified[p])
    done = [r for r in results if r is not None]
    assert len(done) == len(items)
    return pb.RegisterInstancesResponse(results=done, registered=sum(r.registered for r in done),
                                        registry_size=len(service.engine.state.registry), bundle_hash=bundle.content_hash)
