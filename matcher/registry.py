"""The live registry of model instances and the matcher the decision service calls.

Writers (add / remove / update / set_score(s) / swap_bundle) are serialised by one lock and
apply each change to the index in place while holding the reader lock, so a reader sees
the index either before or after an update, never halfway. A bundle swap builds the new
index off to the side (readers keep using the old one) and installs it with one pointer
swap. In CPython readers do not run in parallel anyway, so a plain mutex costs a reader
about a tenth of a microsecond and nothing is copied per update.

Best-k is by the placer's score in [0, 1] (higher is better). A score belongs to a
(model, GPU) group, not to one instance: the placer scores GPUs, and the instances of a
model on one GPU are copies of one choice, so they share it (`ranking.py` ranks the
groups). Setting an instance's score sets its group's; an instance registered without a
score joins its group's. Ties are broken by the group (model, host, GPU), then by id.

Instances are kept as slot-indexed columns (`columns.py`), not objects: a batch
(`add_batch`, `add_many`; `InstanceBatch.from_records` for the fleet store's records) is
registered without an object or an attribute dict per instance, the per-instance work done
on whole columns and the rest once per admission signature (a million instances: ~19 s CPU,
+1.5 GB). Objects are made when asked for (`get`, a match's best, the `instances` form).
`matches` answers in the caller's form (bitmap, slots, ids gathered from the id column, a
set of ids, objects); `admits` checks one instance on its row.

`match` reuses a cached plan per typed request (`plan.py`) and the candidates that plan
last computed while no instance has been added or removed since; `plan_cache=0` turns the
cache off (every request planned and intersected afresh, as a benchmark baseline). The best
candidate alone (k = 1) of a request whose latency target is its only range term comes from
its base's threshold ranks (`threshold_ranks.py`) without a plan; a repeated request gets
its last answer back while neither the fleet nor any score has changed since. After each
build and bundle swap a thread builds every base the bundle's requests can produce
(`base_catalog.py`; `warm` waits for it): at 100,000 instances of the realistic fleet
36,720 bases, ~3 s of that thread's CPU and ~60 MB, so that a request whose fixed values
are new costs ~25 µs rather than ~100.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

from pyroaring import BitMap, FrozenBitMap

from policyc.compiler.bundle import Bundle, Scalar
from policyc.compiler.gc_pause import gc_paused

from .admission_cache import AdmissionCache
from .base_catalog import Prebuilt, prebuild as _prebuild
from .errors import RegistryError, UnknownInstanceError
from .explain import explain as _explain
from .bloom import SHARD_SIZE
from .columns import InstanceBatch, InstanceColumns
from .admission_cache import SIGNATURE_FIELDS
from .index import FleetIndex
from .plan import EXACT_CACHE_SIZE, PLAN_CACHE_SIZE, PlanCache
from .instance import Instance
from .parse import RequestParser
from .ranking import ScoreTiers
from .request import Request
from .row_check import Row
from .result import FORMS, AllMatches, Explanation, Form, MatchResult, Scored
from .slots import SlotAllocator

DEFAULT_SCORE = 0.5


def check_score(name: str, score: float, what: str = "instance") -> float:
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise RegistryError(f"{what} `{name}`: score must be a number in [0, 1], got `{score!r}`")
    return float(score)




def _range_key(attrs: Mapping[str, Scalar], names: tuple[str, ...]) -> tuple[float, ...]:
    """Where an instance goes within its shard group at a build: by its range attributes
    (an instance without one last), so that `slo_latency <= x` is a prefix of each group's
    slots, and its postings and prefix bitmaps (`prefix_bitmaps.py`) are a few long runs
    rather than thousands of short ones."""
    out = []
    for a in names:
        v = attrs.get(a)
        out.append(v if isinstance(v, float) else math.inf)
    return tuple(out)


def _models(bundle: Bundle) -> tuple[str, ...]:
    """The models a registry may hold (admission needs the model's contract): the groups
    on one GPU are found by asking for each, with no per-GPU index to keep."""
    return tuple(c.name for c in bundle.contracts)


def _row_groups(ix: FleetIndex, adm: AdmissionCache, codes: Sequence[int], hosts: Sequence[str], numa: Sequence[int],
                labels: Sequence[Mapping[str, str] | None]) -> tuple[list[dict[str, Scalar]], np.ndarray, np.ndarray]:
    """Instances whose indexed attributes agree, grouped: one admission signature, unless
    the rules read a per-instance fact (host, NUMA node, an instance label). Returns each
    group's attributes (made once, from its first member), each group's first member and
    each instance's group."""
    n = len(codes)
    reads_host, reads_numa = "host" in ix.attr_index, "numa_node" in ix.attr_index
    if reads_host or reads_numa or any(lab is not None for lab in labels):
        table: dict[tuple, int] = {}
        keys = zip(codes, hosts if reads_host else [None] * n, numa if reads_numa else [None] * n,
                   [tuple(sorted(lab.items())) if lab else None for lab in labels])
        row_keys = np.fromiter((table.setdefault(k, len(table)) for k in keys), dtype=np.int64, count=n)
    else:
        row_keys = np.asarray(codes, dtype=np.int64)
    _, first, inverse = np.unique(row_keys, return_index=True, return_inverse=True)
    samples = [adm.row(codes[i], hosts[i], numa[i], labels[i]) for i in first.tolist()]
    return samples, first, inverse.reshape(-1)


def _ranks(column: Sequence[str]) -> np.ndarray:
    """Each value's place among the column's distinct values (Python's order of strings)."""
    at = {v: i for i, v in enumerate(sorted(set(column)))}
    return np.fromiter(map(at.__getitem__, column), dtype=np.int64, count=len(column))


def _score_order(negs: np.ndarray, parts: tuple[Sequence[str], ...], ids: Sequence[str]) -> np.ndarray:
    """The positions in the order (-score, group name, instance id) of `ScoreTiers`, the
    name being the tuple of `parts`: one numpy lexsort on the parts' ranks (each column's
    distinct values sorted in Python, a few thousand), then the ids sorted only within a
    group of several (a Python sort of a million tuples of strings took ~1 s)."""
    n = len(ids)
    ranked = [_ranks(p) for p in parts]
    order = np.lexsort([*ranked[::-1], negs])
    if n < 2:
        return order
    keys = [negs[order], *(r[order] for r in ranked)]
    same = np.ones(n - 1, dtype=bool)
    for k in keys:
        same &= k[1:] == k[:-1]
    if same.any():  # groups of several members: their ids in order
        edges = np.flatnonzero(np.diff(np.concatenate(([False], same, [False])).astype(np.int8)))
        for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist()):
            run = order[a:b + 1].tolist()
            run.sort(key=ids.__getitem__)
            order[a:b + 1] = run
    return order


def _gather(items: Sequence, order: np.ndarray) -> list:
    """`[items[i] for i in order]` by numpy (no Python int per position: a million of them
    would outlive the build in the allocator's arenas)."""
    return np.fromiter(items, dtype=object, count=len(items))[order].tolist()  # type: ignore[no-any-return]


def _gpu_group(instance: Instance) -> tuple[str, str, str]:
    """What a placer chooses between, and what carries a score: a model on a GPU."""
    d = instance.deployment
    return instance.model, d.host, d.gpu


class Registry:
    def __init__(self, bundle: Bundle, instances: Iterable[Instance] = (),
                 scores: Mapping[str, float] | None = None, *, shard_size: int = SHARD_SIZE,
                 plan_cache: int = PLAN_CACHE_SIZE, prebuild: bool = True) -> None:
        self._read = threading.Lock()
        self._write = threading.Lock()
        self._bundle = bundle
        self._parser = RequestParser(bundle)
        self._plan_cache = plan_cache  # request-shape plans kept (0: plan every request afresh)
        self._index = FleetIndex(bundle, shard_size, plan_cache)
        self._slots = SlotAllocator(self._index.shard_size)
        self._tiers = ScoreTiers()
        self._slot_of: dict[str, int] = {}
        # id -> its row in the current index (`row_check.py`): a check by id is one dict
        # read and the row's compiled check, without the slot between (at a million
        # instances each extra read is a cache miss: ~0.5 us of the check)
        self._row_of: dict[str, Row | None] = {}  # (None never stored: the rows' list type)
        # every instance's facts and id as slot-indexed columns (`columns.py`); objects only
        # for instances registered as objects or asked for (`_instance_at`)
        self._cols = InstanceColumns()
        self._objects: dict[int, Instance] = {}
        self._models = _models(bundle)  # every registered instance's model has a contract in the bundle
        self._scored: dict[int, Scored] = {}  # answers built once per (instance, score)
        self._admission = AdmissionCache(bundle)
        self._routable = BitMap()  # slots of instances with an endpoint: a gateway may send them traffic
        # typed request -> [index membership version, score order version, MatchResult, its Base or
        # None] for k = 1: the answer while nothing changed, and where to start once something has
        self._answers = PlanCache(min(plan_cache, EXACT_CACHE_SIZE))
        self._seen = (-1, -1)  # (index, score order) versions at the last k = 1 answer
        # after each build (and bundle swap) a thread builds the bases requests can produce
        # (`base_catalog.py`), so a request with fixed values never seen before finds its base
        # ready; `prebuild=False`: bases made on first request only (tests of that path)
        self._prebuild_on = prebuild and plan_cache > 0
        self._prebuilder: threading.Thread | None = None
        self.prebuilt = Prebuilt()
        items = list(instances)
        if items:
            self.add_many(items, scores)

    def _start_prebuild(self) -> None:
        if not self._prebuild_on:
            return
        index, stats, me = self._index, Prebuilt(), weakref.ref(self)
        self.prebuilt = stats

        def current() -> bool:  # a registry dropped (a reload's old state) or swapped stops it
            reg = me()
            return reg is not None and reg._index is index
        t = threading.Thread(target=_prebuild, name="policyc-prebuild-bases", daemon=True,
                             args=(index, self._tiers, self._read, current, stats))
        self._prebuilder = t
        t.start()

    def warm(self, timeout: float | None = None) -> bool:
        """Wait for the bases of the last build or swap to be prebuilt; True when done (also
        when there was nothing to prebuild)."""
        t = self._prebuilder
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    # ------------------------------------------------------------------ reading
    @property
    def bundle(self) -> Bundle:
        return self._bundle

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._slot_of

    def get(self, instance_id: str) -> Instance:
        with self._read:
            slot = self._slot_of.get(instance_id)
            if slot is None:
                raise UnknownInstanceError(instance_id)
            return self._instance_at(slot)

    def _instance_at(self, slot: int) -> Instance:
        """The instance at `slot` as an object: the one registered, or one made from its row
        (kept, so a caller asking again gets the same object)."""
        obj = self._objects.get(slot)
        if obj is None:
            obj = self._objects[slot] = self._cols.instance(slot)
        return obj

    def _row_view(self) -> Callable[[int], Mapping[str, Scalar]]:
        """`_row` for an index to hold: by a weak reference, so that an index kept by the
        prebuild thread does not keep a dropped registry alive."""
        me = weakref.ref(self)

        def view(slot: int) -> Mapping[str, Scalar]:
            reg = me()
            if reg is None:
                raise KeyError(slot)
            return reg._row(slot)
        return view

    def _row(self, slot: int) -> Mapping[str, Scalar]:
        """The attributes of the instance at `slot`, rebuilt from its row (`slot_attrs.py`)."""
        c = self._cols
        return self._admission.row(int(c.sig[slot]), c.strs["host"][slot], int(c.numa[slot]), c.labels[slot])

    def score(self, instance_id: str) -> float:
        with self._read:
            slot = self._slot_of.get(instance_id)
            if slot is None:
                raise UnknownInstanceError(instance_id)
            return self._group_score(slot)

    def _group_score(self, slot: int) -> float:
        return -self._tiers.group_of[slot].key[0]

    def groups_on(self, host: str, gpu: str) -> int:
        """How many (model, GPU) groups this GPU holds: what a score push for it moves."""
        groups = self._tiers.groups
        return sum((m, host, gpu) in groups for m in self._models)

    def entries(self) -> list[tuple[Instance, Mapping[str, Scalar], float]]:
        """A consistent copy of (instance, attributes, score) for every live instance: what
        a naive scan, an audit or a test looks at."""
        with self._read:
            ix = self._index
            score = self._group_score
            at = self._instance_at
            return [(at(s), ix.attrs[s], score(s)) for s in self._slot_of.values()]

    def parse_request(self, headers: Mapping[str, str], tenant: str | None = None) -> Request:
        """Typed request variables, or `RequestError` naming each bad header."""
        return self._parser.parse(headers, tenant)

    def match(self, request: Request, k: int = 1, *, distinct_gpus: bool = False, routable: bool = False) -> MatchResult:
        """How many instances may serve the request, the best k of them, and the rules that
        applied. `distinct_gpus`: the best instance of each (model, GPU) only, for a placer
        that chooses among GPUs (instances of a model on one GPU share its score and would
        fill the k places with one choice). `routable`: only instances with an endpoint
        (a gateway's request: an instance it cannot send bytes to is no candidate)."""
        with self._read:
            if k == 1 and not routable:  # the best of one distinct GPU is the best instance
                return self._best_one(request)
            return self._match(request, k, distinct_gpus, routable)

    def _best_one(self, request: Request) -> MatchResult:
        """k = 1: the answer last given to this very request while nothing has changed since,
        else from the base's threshold ranks, else planned."""
        ix, tiers, vars = self._index, self._tiers, request.vars
        raw: tuple | None = tuple(vars.items())
        if ix.version != self._seen[0] or tiers.version != self._seen[1]:
            # the fleet or a score changed since the last answer: none cached is current (a
            # fleet changing between every two requests skips the look-up and the upkeep)
            self._seen = (ix.version, tiers.version)
            one = ix.best_one(vars, tiers)
            if one is None:
                return self._match(request, 1, False, False, raw)
            n, slot, applied, _ = one
            return MatchResult(n, () if slot is None else (self._scored_at(slot),), applied, ix.bundle.content_hash)
        try:
            memo = self._answers.get(raw)
        except TypeError:  # an unhashable value (only through `Request.of`): not cached
            raw = memo = None
        if memo is not None and memo[0] == ix.version and memo[1] == tiers.version:
            return memo[2]  # type: ignore[no-any-return]
        one = ix.best_one(vars, tiers, None if memo is None else memo[3])
        if one is None:
            result, base = self._match(request, 1, False, False, raw), None
        else:
            n, slot, applied, base = one
            result = MatchResult(n, () if slot is None else (self._scored_at(slot),), applied, ix.bundle.content_hash)
        if memo is not None:
            memo[:] = (ix.version, tiers.version, result, base)
        elif raw is not None:
            self._answers.put(raw, [ix.version, tiers.version, result, base])
        return result

    def _match(self, request: Request, k: int, distinct_gpus: bool, routable: bool, raw: tuple | None = None) -> MatchResult:
        """`match` through the request's plan and its candidate bitmap."""
        ix, tiers = self._index, self._tiers
        plan = ix.plan(request.vars, raw)
        cand, count = plan.cand, plan.count
        if routable:
            cand = cand & self._routable if cand is not None else BitMap()
            count = len(cand)
        found = tiers.best_distinct(cand, count, k) if distinct_gpus else tiers.best(cand, count, k)  # type: ignore[arg-type]
        scored, group_of = self._scored, tiers.group_of
        best = []
        for s in found:  # `_scored_at`, inlined: up to k of them per call
            score = -group_of[s].key[0]
            sc = scored.get(s)
            if sc is None or sc.score != score:
                sc = scored[s] = Scored(self._instance_at(s) if sc is None else sc.instance, score)
            best.append(sc)
        return MatchResult(count, tuple(best), plan.applied, ix.bundle.content_hash)

    def _scored_at(self, slot: int) -> Scored:
        """The answer for one slot at its group's score (built again once the score moved)."""
        score = -self._tiers.group_of[slot].key[0]
        sc = self._scored.get(slot)
        if sc is None or sc.score != score:
            sc = self._scored[slot] = Scored(self._instance_at(slot) if sc is None else sc.instance, score)
        return sc

    def routable(self) -> tuple[Instance, ...]:
        """The instances with an endpoint (the gateway's pool; a few among the fleet)."""
        with self._read:
            return tuple(self._instance_at(s) for s in self._routable)

    def routable_entries(self) -> tuple[Mapping[str, Scalar], ...]:
        """The attributes of each instance with an endpoint, as rules read them."""
        with self._read:
            attrs = self._index.attrs
            return tuple(attrs[s] for s in self._routable)

    def matches(self, request: Request, form: Form = "instances") -> AllMatches:
        """Every live instance that may serve the request (no ranking), in the form the
        caller asks for (`AllMatches`): the candidate bitmap itself (`bitmap`), its slots as
        a numpy array (`slots`), the ids as an object array gathered from the id column
        (`ids`), a set of ids (`id_set`), or instance objects (`instances`, the slow form:
        an object is made for each match not registered as one). The cost is the plan's
        plus, but for `bitmap`, one read of the bitmap and one gather."""
        if form not in FORMS:
            raise ValueError(f"matches: form must be one of {', '.join(FORMS)}, got {form!r}")
        with self._read:
            ix = self._index
            plan = ix.plan(request.vars)
            cand, count = plan.cand, plan.count
            out = AllMatches(count, plan.applied, ix.bundle.content_hash, form)
            if form == "bitmap":
                out.bitmap = FrozenBitMap(cand) if count else FrozenBitMap()
                return out
            slots = np.frombuffer(cand.to_array(), dtype=np.uint32) if count else np.empty(0, dtype=np.uint32)  # type: ignore[union-attr]
            if form == "slots":
                out.slots = slots
            elif form == "instances":
                objects, row = self._objects, self._cols.instance
                out.instances = tuple([objects.get(s) or row(s) for s in slots.tolist()])
            else:
                ids = self._cols.id[slots]
                if form == "ids":
                    out.ids = ids
                else:
                    out.id_set = set(ids.tolist())
            return out

    def admits(self, request: Request, instance_id: str) -> bool:
        """Whether this one instance may serve the request, read off its own row: the
        rules that apply (memoised by request shape), a kept requirement by one bitmap
        probe, the others on the row's attributes (`FleetIndex.admits_row`). No plan and no
        candidate set is made for one instance. `UnknownInstanceError` for an id not
        registered."""
        lock = self._read  # acquire / release by name: `with` makes two bound methods a call
        lock.acquire()
        try:
            row = self._row_of.get(instance_id)
            if row is None:
                raise UnknownInstanceError(instance_id)
            return self._index.admits_row(row, request.vars)
        finally:
            lock.release()

    def explain(self, request: Request) -> Explanation:
        """Per rule and per predicate, how much of the fleet each eliminated."""
        with self._read:
            return _explain(self._index, request.vars)

    # ------------------------------------------------------------------ writing
    def add(self, instance: Instance, score: float | None = None) -> None:
        """Register an instance; refused (AdmissionError) when its deployment does not
        satisfy its contract, or (RegistryError) when the id is taken. `score` sets its
        group's score; without one it takes its group's (`DEFAULT_SCORE` for a new group)."""
        if score is not None:
            score = check_score(instance.id, score)
        with self._write:
            code = self._admission.code_of(instance)
            if instance.id in self._slot_of:
                raise RegistryError(f"instance `{instance.id}` is already registered; use update()")
            with self._read:
                self._insert(instance, code, score)

    def _insert(self, instance: Instance, code: int, score: float | None) -> None:
        d = instance.deployment
        attrs = self._admission.row(code, d.host, d.numa_node, instance.labels)
        slot = self._slots.take(self._index.shard_group(attrs))
        self._cols.put(slot, instance, code)
        self._index.insert(slot, attrs)
        self._row_of[instance.id] = self._index.rows.rows[slot]
        name = _gpu_group(instance)
        if score is None:
            score = self._tiers.score_of(name)
            score = DEFAULT_SCORE if score is None else score
        self._tiers.add(slot, instance.id, name, -score)
        self._slot_of[instance.id] = slot
        self._objects[slot] = instance
        self._scored.pop(slot, None)
        if instance.deployment.endpoint:
            self._routable.add(slot)

    def _delete(self, instance_id: str) -> float:
        """Take the instance out everywhere; returns its (group's) score."""
        slot = self._slot_of[instance_id]
        self._index.delete(slot)
        return self._forget(instance_id)

    def _forget(self, instance_id: str) -> float:
        """Everything but the index (a bundle swap builds a new one without the instance)."""
        slot = self._slot_of.pop(instance_id)
        self._row_of.pop(instance_id, None)  # (a bundle swap's evicted: not in the new rows)
        score = self._group_score(slot)
        self._tiers.remove(slot)
        self._slots.give(slot)
        self._routable.discard(slot)
        self._objects.pop(slot, None)
        self._cols.clear(slot)
        self._scored.pop(slot, None)
        return score

    def add_many(self, instances: Iterable[Instance], scores: Mapping[str, float] | None = None) -> None:
        """Register many instances at once, all or nothing; into an empty registry this is
        the columnar build (`add_batch`: the objects are read once, not kept)."""
        items = list(instances)
        self.add_batch(InstanceBatch.from_instances(items), scores, items)

    def add_batch(self, batch: InstanceBatch, scores: Mapping[str, float] | None = None,
                  objects: list[Instance] | None = None) -> None:
        """Register a batch (`columns.py`: from instances, the fleet store's records or
        columns), all or nothing: ids unique and new, scores in [0, 1], every row admitted
        (the first refusal raises, naming its id). Into an empty registry this is the index
        build: no object and no attribute dict per instance, the per-instance work done on
        whole columns and the rest once per admission signature. `scores`: by id, over the
        batch's own. `objects`: the batch's rows as objects when the caller has them (kept
        only for the per-instance path into a non-empty registry)."""
        n = len(batch)
        with self._write, gc_paused():
            ids = batch.ids
            if len(set(ids)) != n or not self._slot_of.keys().isdisjoint(ids):
                seen: set[str] = set()
                for iid in ids:
                    if iid in self._slot_of or iid in seen:
                        raise RegistryError(f"instance `{iid}` is already registered; use update()")
                    seen.add(iid)
            given: list[float | None] = list(batch.scores) if batch.scores else [None] * n
            if scores:
                given = [scores.get(iid, g) for iid, g in zip(ids, given)]
            checked = [s if s is None or type(s) is float and 0.0 <= s <= 1.0 else check_score(iid, s)
                       for iid, s in zip(ids, given)]
            d = batch.strs
            facts = [d[f] if f in d else batch.flags[f] for f in SIGNATURE_FIELDS]
            codes = self._admission.codes(ids, batch.models, facts)
            with self._read:
                if self._slot_of:
                    for i, (code, sc) in enumerate(zip(codes, checked)):
                        self._insert(objects[i] if objects is not None else batch.instance(i), code, sc)
                    return
                self._bulk(batch, codes, checked)
        self._start_prebuild()

    def _bulk(self, batch: InstanceBatch, codes: list[int], scores: list[float | None]) -> None:
        """The index build from columns. Instances whose indexed attributes agree (one
        admission signature, unless the rules read a per-instance fact: host, NUMA node,
        an instance label) form one row group, whose attributes are made once. Slots are
        handed out a placement group at a time, within a group in order of the range
        attributes (`_range_key`), then every postings bitmap, Bloom filter and score tier
        is filled from whole lists. A group's score is the last one given to a member (as
        adding them one by one would leave it), `DEFAULT_SCORE` where none was."""
        n = len(batch)
        ix = self._index
        hosts = batch.strs["host"]
        samples, first, inverse = _row_groups(ix, self._admission, codes, hosts, batch.numa, batch.labels)
        # placement groups numbered by first appearance, range keys by rank
        group_num: dict[tuple, int] = {}
        row_group = np.empty(len(samples), dtype=np.int64)
        for r in np.argsort(first, kind="stable").tolist():
            row_group[r] = group_num.setdefault(ix.shard_group(samples[r]), len(group_num))
        ranged = ix.range_attrs
        rkeys = [_range_key(a, ranged) for a in samples]
        rank = {k: i for i, k in enumerate(sorted(set(rkeys)))}
        row_rank = np.array([rank[k] for k in rkeys], dtype=np.int64)
        inst_group = row_group[inverse]
        order = np.lexsort((row_rank[inverse], inst_group)) if ranged else np.argsort(inst_group, kind="stable")
        slots = np.empty(n, dtype=np.int64)
        at = 0
        for group, count in zip(group_num, np.bincount(inst_group, minlength=len(group_num)).tolist()):
            slots[order[at:at + count]] = self._slots.take_many(group, count)
            at += count
        by_row = np.argsort(inverse, kind="stable")
        parts = np.split(slots[by_row], np.cumsum(np.bincount(inverse, minlength=len(samples)))[:-1])
        slot_list = slots.tolist()
        self._slot_of = dict(zip(batch.ids, slot_list))
        self._objects = {}
        self._cols.put_batch(slots, batch, np.asarray(codes, dtype=np.int32))
        ends = batch.strs["endpoint"]
        self._routable = BitMap(sorted(s for s, e in zip(slot_list, ends) if e))
        names = list(zip(batch.models, hosts, batch.strs["gpu"]))
        gscore: dict[tuple[str, str, str], float] = {}
        for name, sc in zip(names, scores):
            if sc is not None:
                gscore[name] = sc
            elif name not in gscore:
                gscore[name] = DEFAULT_SCORE
        ix.bulk_rows(list(zip(samples, parts)), self._row_view())
        self._row_of = dict(zip(batch.ids, map(ix.rows.rows.__getitem__, slot_list)))
        negs = -np.fromiter(map(gscore.__getitem__, names), dtype=np.float64, count=n)
        order = _score_order(negs, (batch.models, hosts, batch.strs["gpu"]), batch.ids)
        self._tiers.bulk_sorted(negs[order], _gather(names, order), _gather(batch.ids, order), _gather(slot_list, order))

    def remove(self, instance_id: str) -> None:
        with self._write, self._read:
            if instance_id not in self._slot_of:
                raise UnknownInstanceError(instance_id)
            self._delete(instance_id)

    def update(self, instance: Instance) -> None:
        """Replace a registered instance (same id), atomic for readers. It keeps its score,
        unless it now joins another group that exists: then it takes that group's."""
        with self._write:
            if instance.id not in self._slot_of:
                raise UnknownInstanceError(instance.id)
            code = self._admission.code_of(instance)
            with self._read:
                score = self._delete(instance.id)
                self._insert(instance, code, None if _gpu_group(instance) in self._tiers.groups else score)

    def set_score(self, instance_id: str, score: float) -> None:
        """Set the ranking score of an instance's group: a batch of one (`set_scores`)."""
        self.set_scores(((instance_id, score),))

    def set_scores(self, updates: Iterable[tuple[str, float]]) -> None:
        """Set the scores of many instances' groups, all or nothing: every item is checked
        (its score, then its id, in order; the first bad one raises `set_score`'s error)
        before anything changes, so a refused batch leaves the registry as it was. A
        group named twice takes its last score, as applying the items one by one would."""
        with self._write:
            moves = self._checked_scores(updates)
            if moves:
                with self._read:
                    self._tiers.move_many([(name, -score) for name, score in moves.items()])

    def set_gpu_scores(self, changes: Iterable[tuple[str, str, float]]) -> int:
        """Set each (host, GPU, score)'s score on every group on that GPU, all or nothing
        (scores checked first); a GPU holding no instance is skipped (its last one may
        have just left). Returns how many groups moved.

        What the placer's score pusher calls: one lock pair, one validation pass and one
        vectorised tier lookup (`ScoreTiers.move_many`) per batch, and one move per
        (model, GPU), whatever the number of copies on it."""
        with self._write:
            moves: dict[tuple[str, str, str], float] = {}
            groups, models = self._tiers.groups, self._models
            for host, gpu, score in changes:
                if not (type(score) is float and 0.0 <= score <= 1.0):
                    score = check_score(f"{host}/{gpu}", score, "GPU")
                for m in models:
                    name = (m, host, gpu)
                    if name in groups:
                        moves[name] = score
            if not moves:
                return 0
            with self._read:
                return len(self._tiers.move_many([(name, -score) for name, score in moves.items()]))

    def _checked_scores(self, updates: Iterable[tuple[str, float]]) -> dict[Hashable, float]:
        """group -> score for each item, the last score of a group winning; raises at the
        first bad item. Plain floats in range skip `check_score` (NaN fails the comparison
        and takes the full check)."""
        slot_of, group_of = self._slot_of, self._tiers.group_of
        moves: dict[Hashable, float] = {}
        for iid, score in updates:
            if not (type(score) is float and 0.0 <= score <= 1.0):
                score = check_score(iid, score)
            slot = slot_of.get(iid)
            if slot is None:
                raise UnknownInstanceError(iid)
            moves[group_of[slot].name] = score
        return moves

    def swap_bundle(self, bundle: Bundle, *, evict_inadmissible: bool = False) -> tuple[str, ...]:
        """Switch to a new bundle. Every instance is re-admitted under it; instances it no
        longer admits make the swap fail (RegistryError naming them, nothing changed), or
        are evicted and returned when `evict_inadmissible`. Readers keep the old index
        until the new one is complete."""
        with self._write, gc_paused():
            new_index = FleetIndex(bundle, self._index.shard_size, self._plan_cache)
            admission = AdmissionCache(bundle)
            c = self._cols
            ids = list(self._slot_of)
            slots = np.fromiter(self._slot_of.values(), dtype=np.int64, count=len(ids))
            col = {**c.strs, **c.flags}
            facts = [col[f][slots].tolist() for f in SIGNATURE_FIELDS]
            bad: list[tuple[int, tuple[str, ...]]] = []
            codes = admission.codes(ids, c.model[slots].tolist(), facts, bad)
            if bad and not evict_inadmissible:
                more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
                raise RegistryError("the new bundle does not admit registered instances: "
                                    + "; ".join(f"{ids[i]}: {problems[0]}" for i, problems in bad[:5]) + more)
            evicted = [ids[i] for i, _ in bad]
            keep = np.array([code >= 0 for code in codes], dtype=bool)
            kept = slots[keep]
            kept_codes = [code for code in codes if code >= 0]
            samples, _, inverse = _row_groups(new_index, admission, kept_codes, c.strs["host"][kept].tolist(),
                                              c.numa[kept].tolist(), c.labels[kept].tolist())
            by_row = np.argsort(inverse, kind="stable")
            parts = np.split(kept[by_row], np.cumsum(np.bincount(inverse, minlength=len(samples)))[:-1])
            new_index.bulk_rows(list(zip(samples, parts)), self._row_view())  # every row rebuilt from the columns
            parser = RequestParser(bundle)
            rows = new_index.rows.rows
            row_of = {iid: rows[s] for iid, s, k in zip(ids, slots.tolist(), keep.tolist()) if k}
            with self._read:
                self._index, self._parser, self._bundle = new_index, parser, bundle
                self._row_of = row_of
                self._answers.clear()  # answers of the old index, whose versions the new one restarts
                self._seen = (-1, -1)
                self._models = _models(bundle)
                for iid in evicted:
                    self._forget(iid)
                self._admission = admission
                c.sig[kept] = kept_codes
        self._start_prebuild()
        return tuple(evicted)

    # ------------------------------------------------------------------ measuring
    @property
    def index(self) -> FleetIndex:
        """The current index (for benchmarks and tests; do not mutate)."""
        return self._index
