"""RegisterInstances' checks, column by column: the same verdicts as RegisterInstance's
one-by-one checks (`DecisionService._checked_registration`), without an `Instance` per item.

Each item's fields are read once into columns (`InstanceBatch`'s). Then every check runs
on a whole column, optimistically: the text rules (printable ASCII, lengths) on the joined
column, the CUDA version once per distinct value, admission once per deployment signature
(`AdmissionCache.codes`), the facts against the topology once per distinct claim, the
endpoint rules per item that names an endpoint, the score range per item. An item that
any of these flags, or that carries its contract inline (JSON or ONNX), goes through
RegisterInstance's own checks one by one, so its refusal (status, field, code, the first
problem in RegisterInstance's order) is exactly RegisterInstance's; only items every
check passes skip them. `tests/server/test_register_columns.py` holds the verdicts of both
paths equal item by item.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from policyc.compiler.bundle import Bundle
from policyc.compiler.check_values import version_key
from policyc.matcher import Instance
from policyc.matcher.admission_cache import SIGNATURE_FIELDS, AdmissionCache
from policyc.matcher.columns import FLAG_FACTS, STR_FACTS, InstanceBatch
from policyc.matcher.instance import canonical_endpoint

from .bulk_registration import subset
from .convert import _PRINTABLE, MAX_ID_CHARS, MAX_LABELS
from .errors import ServiceError
from .registration import check_facts

if TYPE_CHECKING:
    from .proto import pb
    from .service import DecisionService

YIELD_EVERY = 2048  # items read between two turns of the serving loop (a few ms)
EXACT_YIELD_EVERY = 256  # items checked one by one between two turns (~100 µs an item)
LABEL_VALUE_CHARS = 4096


@dataclass(slots=True)
class CheckedItems:
    """The items that passed every check, as a batch in item order (`items[r]`: the item
    index of row r; `unverified[r]`: the facts no telemetry could tell), and the refused
    items' errors by item index."""

    batch: InstanceBatch
    items: list[int]
    unverified: list[tuple[str, ...]]
    refused: dict[int, ServiceError]


def _bad_text(col: Sequence[str], limit: int) -> list[int]:
    """Positions in `col` breaking the text rule (`convert._check_text`): one regex over
    the joined column when all are good, the usual case."""
    if not col or (max(map(len, col)) <= limit and _PRINTABLE.fullmatch("".join(col))):
        return []
    return [i for i, v in enumerate(col) if len(v) > limit or not _PRINTABLE.fullmatch(v)]


async def check_items(service: "DecisionService", items: Sequence["pb.RegisterInstanceRequest"],
                      bundle: Bundle) -> CheckedItems:
    """Every item checked as RegisterInstance checks it (see the module's docstring)."""
    topology = service.topology()
    exact: set[int] = set()  # items checked one by one
    pos: list[int] = []  # item index of each fast row
    ids: list[str] = []
    models: list[str] = []
    raw: dict[str, list[str]] = {n: [] for n, _ in STR_FACTS}  # as sent (defaults not applied)
    numa: list[int] = []
    flags: dict[str, list[bool]] = {n: [] for n in FLAG_FACTS}
    labels: list[dict[str, str] | None] = []
    scores: list[float | None] = []
    str_cols = [(n, raw[n].append) for n, _ in STR_FACTS]
    flag_cols = [(n, flags[n].append) for n in FLAG_FACTS]
    for i, item in enumerate(items):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)
        if (item.WhichOneof("contract") is not None or not item.model or not item.id
                or not item.HasField("deployment") or len(item.labels) > MAX_LABELS):
            exact.add(i)
            continue
        d = item.deployment
        pos.append(i)
        ids.append(item.id)
        models.append(item.model)
        for n, put in str_cols:
            put(getattr(d, n))
        numa.append(d.numa_node)
        for n, put_flag in flag_cols:
            put_flag(getattr(d, n))
        labels.append(dict(item.labels) or None)
        scores.append(item.score if item.HasField("score") else None)
    flagged: set[int] = set()  # fast rows some check refuses
    for col, limit in ((ids, MAX_ID_CHARS), (models, MAX_ID_CHARS), *((raw[n], MAX_ID_CHARS) for n, _ in STR_FACTS)):
        flagged.update(_bad_text(col, limit))
    for n in ("host", "gpu", "gpu_model", "region"):  # required
        flagged.update(r for r, v in enumerate(raw[n]) if not v)
    bad_cuda = {c for c in set(raw["cuda"]) if c and version_key(c) is None}
    if bad_cuda:
        flagged.update(r for r, c in enumerate(raw["cuda"]) if c in bad_cuda)
    with_labels = [r for r, lab in enumerate(labels) if lab]
    if with_labels:
        keys = [k for r in with_labels for k in labels[r]]  # type: ignore[union-attr]
        values = [v for r in with_labels for v in labels[r].values()]  # type: ignore[union-attr]
        if _bad_text(keys, MAX_ID_CHARS) or _bad_text(values, LABEL_VALUE_CHARS):
            flagged.update(r for r in with_labels if _bad_text(list(labels[r]), MAX_ID_CHARS)  # type: ignore[arg-type]
                           or _bad_text(list(labels[r].values()), LABEL_VALUE_CHARS))  # type: ignore[union-attr]
    strs = {n: raw[n] if default is None else [v or default for v in raw[n]] for n, default in STR_FACTS}
    ends = strs["endpoint"]
    for r, e in enumerate(ends):
        if e:
            try:  # RegisterInstance: the endpoint rules first (on the text as sent), then its syntax
                service.endpoints.check(ids[r], e, raw["host"][r], topology)
                ends[r] = canonical_endpoint(e)
            except (ServiceError, ValueError):
                flagged.add(r)
    for r, s in enumerate(scores):
        if s is not None and not 0.0 <= s <= 1.0:
            flagged.add(r)
    batch = InstanceBatch(ids, models, strs, numa, flags, labels, scores if any(s is not None for s in scores) else [])
    # admission by signature: an inadmissible row is not checked against the telemetry
    # (the registry refuses it first, saying what its contract requires: `screen`)
    refused: list[tuple[int, tuple[str, ...]]] = []
    AdmissionCache(bundle).codes(ids, models, [strs[f] if f in strs else flags[f] for f in SIGNATURE_FIELDS], refused)
    inadmissible = {r for r, _ in refused}
    unverified: list[tuple[str, ...]] = [()] * len(ids)
    known: dict[tuple, tuple[str, ...] | None] = {}  # a claim's facts -> unverified facts, None: refused
    unseen = ("",)  # no claim's answer: a check's answer is a tuple of fact names or None
    fact_cols = [strs["host"], strs["gpu"], strs["gpu_model"], numa, strs["region"], strs["cuda"],
                 *(flags[n] for n in FLAG_FACTS), strs["session_state"]]
    for r, claim in enumerate(zip(*fact_cols)):
        if r in inadmissible or r in flagged:
            continue
        got = known.get(claim, unseen)
        if got is unseen:
            try:
                got = tuple(check_facts(batch.instance(r), topology))
            except ServiceError:
                got = None
            known[claim] = got
        if got is None:
            flagged.add(r)
        else:
            unverified[r] = got
    exact.update(pos[r] for r in flagged)
    errors: dict[int, ServiceError] = {}
    extra: list[tuple[int, Instance, float | None, tuple[str, ...]]] = []
    for k, i in enumerate(sorted(exact)):
        if k % EXACT_YIELD_EVERY == EXACT_YIELD_EVERY - 1:
            await asyncio.sleep(0)
        try:
            inst, _, score, unv = await service._checked_registration(items[i], bundle)
        except ServiceError as e:
            errors[i] = e
        else:
            extra.append((i, inst, score, unv))
    keep = [r for r in range(len(ids)) if r not in flagged]
    out = subset(batch, keep)
    rows = [pos[r] for r in keep]
    unv_rows = [unverified[r] for r in keep]
    if extra:
        out, rows, unv_rows = _merged(out, rows, unv_rows, extra)
    return CheckedItems(out, rows, unv_rows, errors)


def _merged(batch: InstanceBatch, rows: list[int], unverified: list[tuple[str, ...]],
            extra: list[tuple[int, Instance, float | None, tuple[str, ...]]]) -> tuple[InstanceBatch, list[int], list[tuple[str, ...]]]:
    """The fast rows and the items checked one by one that passed, as one batch in item order."""
    more = InstanceBatch.from_instances([e[1] for e in extra], {e[1].id: e[2] for e in extra if e[2] is not None})
    n, m = len(batch), len(more)
    both_scores = (batch.scores or [None] * n) + (more.scores or [None] * m) if batch.scores or more.scores else []
    joined = InstanceBatch(batch.ids + more.ids, batch.models + more.models,
                           {k: batch.strs[k] + more.strs[k] for k, _ in STR_FACTS}, batch.numa + more.numa,
                           {k: batch.flags[k] + more.flags[k] for k in FLAG_FACTS}, batch.labels + more.labels,
                           both_scores)
    all_rows = rows + [e[0] for e in extra]
    all_unv = unverified + [e[3] for e in extra]
    order = sorted(range(n + m), key=all_rows.__getitem__)

    def take(col: list) -> list:  # type: ignore[type-arg]
        return [col[k] for k in order]
    ordered = InstanceBatch(take(joined.ids), take(joined.models), {k: take(v) for k, v in joined.strs.items()},
                            take(joined.numa), {k: take(v) for k, v in joined.flags.items()}, take(joined.labels),
                            take(joined.scores) if joined.scores else [])
    return ordered, take(all_rows), take(all_unv)

