"""Instances as columns: what the registry keeps per slot, and the batch form bulk
registration takes.

A fleet of a million instances as pydantic objects costs about 1 KB and 36 µs each before
the registry sees them, and reading an id off each object of a broad answer costs more
than finding the answer. So the registry keeps each deployment fact in a slot-indexed
column (numpy arrays; strings as object arrays of interned `str`, so a million rows of
one region share one string), the ids included: an answer's ids are one gather
(`ids_at`). An `Instance` object is made only when a caller asks for one (`instance`).

`InstanceBatch` is the input side: the same facts by position, built from instances
(`from_instances`), from plain records as the fleet store keeps them (`from_records`:
checked field by field, each problem naming the record), or from columns a caller
already holds. A batch is registered without an object per instance
(`Registry.add_batch`).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import RegistryError
from .instance import Deployment, Instance, canonical_endpoint

# string facts of a deployment, in `Deployment`'s order, and their defaults (None: required)
STR_FACTS: tuple[tuple[str, str | None], ...] = (
    ("host", None), ("gpu", None), ("gpu_model", None), ("region", None), ("session_state", "remote"),
    ("cuda", "12.4"), ("endpoint", ""))
FLAG_FACTS = ("tpm", "memory_encryption", "hardware_firewall", "tee")
DEPLOYMENT_FIELDS = frozenset(n for n, _ in STR_FACTS) | frozenset(FLAG_FACTS) | {"numa_node"}
INSTANCE_FIELDS = frozenset({"id", "model", "deployment", "labels"})
MAX_TEXT = 4096  # longest id, model, label or deployment string a record may carry
_intern = sys.intern


@dataclass(slots=True)
class InstanceBatch:
    """Instances by position: `ids[i]`, `models[i]`, ... describe the i-th instance. Values
    are already checked (`from_records`) or come from checked objects (`from_instances`)."""

    ids: list[str]
    models: list[str]
    strs: dict[str, list[str]]  # each of STR_FACTS
    numa: list[int]
    flags: dict[str, list[bool]]  # each of FLAG_FACTS
    labels: list[dict[str, str] | None]  # None: no labels
    scores: list[float | None] = field(default_factory=list)  # per instance, or empty: none given

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_instances(cls, items: Sequence[Instance], scores: Mapping[str, float] | None = None) -> InstanceBatch:
        ids = [i.id for i in items]
        deps = [i.deployment.__dict__ for i in items]
        strs = {n: [d[n] for d in deps] for n, _ in STR_FACTS}
        flags = {n: [d[n] for d in deps] for n in FLAG_FACTS}
        got = scores or {}
        return cls(ids, [i.model for i in items], strs, [d["numa_node"] for d in deps], flags,
                   [i.labels or None for i in items], [got.get(i) for i in ids] if got else [])

    @classmethod
    def from_records(cls, records: Iterable[tuple[str, Any, Any]]) -> InstanceBatch:
        """From (where, instance record, score or None) triples, a record being what
        `Instance.model_dump(mode="json")` writes (the fleet store's form). Every field is
        checked as `Instance` would check it (types, no unknown field, a canonical
        endpoint); the first bad record raises RegistryError naming `where` and the field."""
        ids: list[str] = []
        models: list[str] = []
        strs: dict[str, list[str]] = {n: [] for n, _ in STR_FACTS}
        numa: list[int] = []
        flags: dict[str, list[bool]] = {n: [] for n in FLAG_FACTS}
        labels: list[dict[str, str] | None] = []
        scores: list[float | None] = []
        str_facts = [(n, d, strs[n].append) for n, d in STR_FACTS]
        flag_facts = [(n, flags[n].append) for n in FLAG_FACTS]
        for where, rec, score in records:
            if type(rec) is not dict:
                raise RegistryError(f"{where}: an instance record must be an object, got {type(rec).__name__}")
            if not INSTANCE_FIELDS.issuperset(rec):
                raise RegistryError(f"{where}: unknown field(s) {', '.join(sorted(map(str, set(rec) - INSTANCE_FIELDS)))}")
            ids.append(_text(where, "id", rec.get("id")))
            models.append(_intern(_text(where, "model", rec.get("model"))))
            dep = rec.get("deployment")
            if type(dep) is not dict:
                raise RegistryError(f"{where}: `deployment` must be an object")
            if not DEPLOYMENT_FIELDS.issuperset(dep):
                raise RegistryError(f"{where}: unknown deployment field(s) "
                                    f"{', '.join(sorted(map(str, set(dep) - DEPLOYMENT_FIELDS)))}")
            for name, default, put in str_facts:
                v = dep.get(name, default)
                if name == "endpoint" and v:
                    try:
                        v = canonical_endpoint(_text(where, "deployment.endpoint", v))
                    except ValueError as e:
                        raise RegistryError(f"{where}: deployment.endpoint: {e}") from None
                put(_intern(_text(where, "deployment." + name, v)))
            n = dep.get("numa_node", 0)
            if type(n) is not int or not 0 <= n < 2**31:
                raise RegistryError(f"{where}: deployment.numa_node must be an integer in [0, 2^31), got {n!r}")
            numa.append(n)
            for name, put_flag in flag_facts:
                f = dep.get(name, False)
                if type(f) is not bool:
                    raise RegistryError(f"{where}: deployment.{name} must be true or false, got {f!r}")
                put_flag(f)
            lab = rec.get("labels") or None
            if lab is not None:
                if type(lab) is not dict or not all(type(k) is str and type(v) is str and len(k) <= MAX_TEXT
                                                    and len(v) <= MAX_TEXT for k, v in lab.items()):
                    raise RegistryError(f"{where}: `labels` must map strings to strings")
                lab = dict(lab)
            labels.append(lab)
            if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                                      or not math.isfinite(score) or not 0.0 <= score <= 1.0):
                raise RegistryError(f"{where}: score must be a number in [0, 1], got {score!r}")
            scores.append(None if score is None else float(score))
        return cls(ids, models, strs, numa, flags, labels, scores if any(s is not None for s in scores) else [])

    def instance(self, i: int) -> Instance:
        """The i-th instance as an object (fields already checked)."""
        s = self.strs
        values: dict[str, Any] = {n: s[n][i] for n, _ in STR_FACTS}
        values.update({n: self.flags[n][i] for n in FLAG_FACTS}, numa_node=self.numa[i])
        dep = Deployment.model_construct(**values)
        return Instance.model_construct(id=self.ids[i], model=self.models[i], deployment=dep,
                                        labels=dict(self.labels[i] or {}))


def _text(where: str, name: str, v: object) -> str:
    if type(v) is not str:
        raise RegistryError(f"{where}: `{name}` must be a string, got {v!r}")
    if len(v) > MAX_TEXT:
        raise RegistryError(f"{where}: `{name}` is longer than {MAX_TEXT} characters")
    return v


class InstanceColumns:
    """The registered instances' facts, slot-indexed (a free slot's id is None)."""

    def __init__(self, capacity: int = 1024) -> None:
        self.id = np.empty(capacity, dtype=object)
        self.model = np.empty(capacity, dtype=object)
        self.strs = {n: np.empty(capacity, dtype=object) for n, _ in STR_FACTS}
        self.numa = np.zeros(capacity, dtype=np.int32)
        self.flags = {n: np.zeros(capacity, dtype=bool) for n in FLAG_FACTS}
        self.labels = np.empty(capacity, dtype=object)
        self.sig = np.full(capacity, -1, dtype=np.int32)  # admission signature (`AdmissionCache.code`)

    def _columns(self) -> list[tuple[object, str, np.ndarray]]:
        cols: list[tuple[object, str, np.ndarray]] = [(self, "id", self.id), (self, "model", self.model),
                                                      (self, "numa", self.numa), (self, "labels", self.labels),
                                                      (self, "sig", self.sig)]
        cols += [(self.strs, n, a) for n, a in self.strs.items()]
        cols += [(self.flags, n, a) for n, a in self.flags.items()]
        return cols

    def reserve(self, size: int) -> None:
        """Room for slots below `size` (doubling, so growth is amortised)."""
        have = len(self.id)
        if size <= have:
            return
        new = max(size, 2 * have)
        for owner, name, arr in self._columns():
            grown = np.empty(new, dtype=arr.dtype) if arr.dtype == object else np.zeros(new, dtype=arr.dtype)
            if name == "sig":
                grown[:] = -1
            grown[:have] = arr
            if isinstance(owner, dict):
                owner[name] = grown
            else:
                setattr(owner, name, grown)

    def put(self, slot: int, inst: Instance, sig: int) -> None:
        self.reserve(slot + 1)
        d = inst.deployment.__dict__
        self.id[slot] = inst.id
        self.model[slot] = _intern(inst.model)
        for n, arr in self.strs.items():
            arr[slot] = _intern(d[n])
        self.numa[slot] = d["numa_node"]
        for n, farr in self.flags.items():
            farr[slot] = d[n]
        self.labels[slot] = dict(inst.labels) if inst.labels else None
        self.sig[slot] = sig

    def put_batch(self, slots: np.ndarray, batch: InstanceBatch, sigs: np.ndarray) -> None:
        """Every row of `batch` at once, row i at `slots[i]`."""
        if not len(slots):
            return
        self.reserve(int(slots.max()) + 1)
        self.id[slots] = np.fromiter(batch.ids, dtype=object, count=len(slots))
        self.model[slots] = np.fromiter(batch.models, dtype=object, count=len(slots))
        for n, arr in self.strs.items():
            arr[slots] = np.fromiter(batch.strs[n], dtype=object, count=len(slots))
        self.numa[slots] = batch.numa
        for n, farr in self.flags.items():
            farr[slots] = batch.flags[n]
        if any(lab is not None for lab in batch.labels):
            self.labels[slots] = np.fromiter(batch.labels, dtype=object, count=len(slots))
        self.sig[slots] = sigs

    def clear(self, slot: int) -> None:
        self.id[slot] = None
        self.labels[slot] = None
        self.sig[slot] = -1

    def instance(self, slot: int) -> Instance:
        """The instance at `slot` as an object, made from its row (its fields were checked
        when it was registered)."""
        values: dict[str, Any] = {n: a[slot] for n, a in self.strs.items()}
        values.update({n: bool(a[slot]) for n, a in self.flags.items()}, numa_node=int(self.numa[slot]))
        dep = Deployment.model_construct(**values)
        lab = self.labels[slot]
        return Instance.model_construct(id=self.id[slot], model=self.model[slot], deployment=dep,
                                        labels=dict(lab) if lab else {})

    def group(self, slot: int) -> tuple[str, str, str]:
        """(model, host, GPU): what carries a score (`ranking.py`)."""
        return self.model[slot], self.strs["host"][slot], self.strs["gpu"][slot]

    def ids_at(self, slots: np.ndarray) -> np.ndarray:
        """The ids of `slots` (an object array of `str`, one gather)."""
        return self.id[slots]
