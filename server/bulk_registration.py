"""Registering many instances at once without an `Instance` object per instance, and
without letting one bad item stop the rest.

Two callers: a replica loading the fleet store's snapshot at start (etcd or the embedded
state dir), and the `RegisterInstances` RPC. Both hold plain records (the fleet store's
JSON form), and both must refuse exactly what registering one by one would refuse: a
record whose fields are wrong (`InstanceBatch.from_records`'s checks), an instance whose
deployment fails its contract (the bundle's admission), and an endpoint that breaks a rule
of `endpoint_rules.py`. The batch is screened row by row on its columns, the refused rows
are listed (position, id, field, why), and the rest are registered in one
`Registry.add_batch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from policyc.compiler.bundle import Bundle
from policyc.matcher.admission_cache import SIGNATURE_FIELDS, AdmissionCache
from policyc.matcher.columns import FLAG_FACTS, STR_FACTS, InstanceBatch
from policyc.matcher.errors import RegistryError

# (instance id, endpoint, host) -> why it is refused, or None
EndpointCheck = Callable[[str, str, str], "str | None"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """One item not registered: `index` is its position in the caller's input."""

    index: int
    where: str  # the caller's name for the item (a store key, "item 3")
    instance_id: str  # "" when the record has none readable
    field: str  # the field at fault ("deployment.endpoint", "model", ...; "" when the whole record)
    reason: str


def _field_of(message: str) -> str:
    """The field a `from_records` message names (`deployment.x` or `x` in backquotes)."""
    if ": deployment." in message:
        return "deployment." + message.split(": deployment.", 1)[1].split(" ", 1)[0].rstrip(":")
    for token in message.split("`")[1::2]:
        if token.replace(".", "").replace("_", "").isalnum():
            return token
    if "score" in message:
        return "score"
    return ""


def batch_from_records(records: Sequence[tuple[str, Any, Any]]) -> tuple[InstanceBatch, list[int], list[Refusal]]:
    """The batch of the well-formed records, the input positions of its rows, and the
    refusals of the others. The whole input is checked in one pass; only when some record
    is bad is it checked record by record to find every bad one."""
    try:
        return InstanceBatch.from_records(records), list(range(len(records))), []
    except RegistryError:
        pass
    good: list[tuple[str, Any, Any]] = []
    positions: list[int] = []
    refused: list[Refusal] = []
    for i, rec in enumerate(records):
        try:
            InstanceBatch.from_records([rec])
        except RegistryError as e:
            body = rec[1]
            got = body.get("id") if isinstance(body, dict) else None
            iid = got if isinstance(got, str) else ""
            refused.append(Refusal(i, rec[0], iid, _field_of(str(e)), str(e)))
        else:
            good.append(rec)
            positions.append(i)
    return InstanceBatch.from_records(good), positions, refused


def subset(batch: InstanceBatch, keep: Sequence[int]) -> InstanceBatch:
    """The rows of `batch` at `keep`, in that order."""
    if len(keep) == len(batch):
        return batch

    def take(col: list[Any]) -> list[Any]:
        return [col[i] for i in keep]
    return InstanceBatch(take(batch.ids), take(batch.models), {n: take(batch.strs[n]) for n, _ in STR_FACTS},
                         take(batch.numa), {n: take(batch.flags[n]) for n in FLAG_FACTS}, take(batch.labels),
                         take(batch.scores) if batch.scores else [])


def screen(batch: InstanceBatch, bundle: Bundle, *, endpoint: EndpointCheck | None = None,
           host_check: Callable[[str, bool], str] | None = None, taken: Iterable[str] = (),
           wheres: Sequence[str] | None = None, positions: Sequence[int] | None = None,
           ) -> tuple[InstanceBatch, list[int], list[Refusal]]:
    """The rows `bundle` admits whose endpoint the rules allow, their positions, and the
    refusals of the others (named as registering them one by one would: admission's
    problems, the endpoint rule, an id already taken or given twice). `host_check(host,
    tpm)`: why a host's claim is not trusted ("" when it is: the replica's attestation)."""
    n = len(batch)
    pos = list(positions) if positions is not None else list(range(n))
    where = list(wheres) if wheres is not None else [f"item {p + 1}" for p in pos]
    bad: dict[int, Refusal] = {}
    refused: list[tuple[int, tuple[str, ...]]] = []
    facts = [batch.strs[f] if f in batch.strs else batch.flags[f] for f in SIGNATURE_FIELDS]
    AdmissionCache(bundle).codes(batch.ids, batch.models, facts, refused)
    for i, problems in refused:
        f = "model" if any(p.startswith("unknown model") for p in problems) else "deployment"
        bad[i] = Refusal(pos[i], where[i], batch.ids[i], f,
                         f"instance `{batch.ids[i]}` cannot be registered: " + "; ".join(problems))
    seen = set(taken)
    ends, hosts, tpm = batch.strs["endpoint"], batch.strs["host"], batch.flags["tpm"]
    for i, iid in enumerate(batch.ids):
        if i in bad:
            continue
        if iid in seen:
            bad[i] = Refusal(pos[i], where[i], iid, "id", f"instance `{iid}` is already registered")
            continue
        if endpoint is not None and ends[i]:
            why = endpoint(iid, ends[i], hosts[i])
            if why is not None:
                bad[i] = Refusal(pos[i], where[i], iid, "deployment.endpoint", why)
                continue
        if host_check is not None:
            why = host_check(hosts[i], tpm[i])
            if why:
                bad[i] = Refusal(pos[i], where[i], iid, "deployment.tpm", f"instance `{iid}`: {why}")
                continue
        seen.add(iid)  # only a row that is registered takes its id (a refused one leaves it free)
    keep = [i for i in range(n) if i not in bad]
    return subset(batch, keep), [pos[i] for i in keep], sorted(bad.values(), key=lambda r: r.index)
