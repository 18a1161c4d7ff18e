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
from typing import Hashable, Iterable, Mapping

import numpy as np

from pyroaring import BitMap

from policyc.compiler.bundle import Bundle, Scalar
from policyc.compiler.gc_pause import gc_paused

from .admission_cache import AdmissionCache
from .base_catalog import Prebuilt, prebuild as _prebuild
from .errors import AdmissionError, RegistryError, UnknownInstanceError
from .explain import explain as _explain
from .bloom import SHARD_SIZE
from .index import FleetIndex
from .plan import EXACT_CACHE_SIZE, PLAN_CACHE_SIZE, PlanCache
from .instance import Instance
from .parse import RequestParser
from .ranking import ScoreTiers
from .request import Request
from .result import AllMatches, Explanation, MatchResult, Scored
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
        self._instance: dict[int, Instance] = {}
        self._by_slot = np.empty(1024, dtype=object)  # slot -> Instance (None when free), for `matches`
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
        slot = self._slot_of.get(instance_id)
        if slot is None:
            raise UnknownInstanceError(instance_id)
        return self._instance[slot]

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
            return [(self._instance[s], ix.attrs[s], score(s)) for s in self._slot_of.values()]

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
        inst, scored, group_of = self._instance, self._scored, tiers.group_of
        best = []
        for s in found:  # `_scored_at`, inlined: up to k of them per call
            score = -group_of[s].key[0]
            sc = scored.get(s)
            if sc is None or sc.score != score:
                sc = scored[s] = Scored(inst[s], score)
            best.append(sc)
        return MatchResult(count, tuple(best), plan.applied, ix.bundle.content_hash)

    def _scored_at(self, slot: int) -> Scored:
        """The answer for one slot at its group's score (built again once the score moved)."""
        score = -self._tiers.group_of[slot].key[0]
        sc = self._scored.get(slot)
        if sc is None or sc.score != score:
            sc = self._scored[slot] = Scored(self._instance[slot], score)
        return sc

    def routable(self) -> tuple[Instance, ...]:
        """The instances with an endpoint (the gateway's pool; a few among the fleet)."""
        with self._read:
            return tuple(self._instance[s] for s in self._routable)

    def routable_entries(self) -> tuple[Mapping[str, Scalar], ...]:
        """The attributes of each instance with an endpoint, as rules read them."""
        with self._read:
            attrs = self._index.attrs
            return tuple(attrs[s] for s in self._routable)

    def matches(self, request: Request) -> AllMatches:
        """Every live instance that may serve the request (no ranking): the index's
        candidate bitmap read out through a slot-indexed array, so the cost is the
        plan's plus one gather, not a walk in rank order."""
        with self._read:
            ix = self._index
            plan = ix.plan(request.vars)
            cand = plan.cand
            if not plan.count:
                found: tuple[Instance, ...] = ()
            else:
                found = tuple(self._by_slot[np.frombuffer(cand.to_array(), dtype=np.uint32)].tolist())  # type: ignore[union-attr]
            return AllMatches(found, plan.applied, ix.bundle.content_hash)

    def _place(self, slot: int, instance: Instance | None) -> None:
        by = self._by_slot
        if slot >= len(by):
            grown = np.empty(max(2 * len(by), slot + 1), dtype=object)
            grown[:len(by)] = by
            by = self._by_slot = grown
        by[slot] = instance

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
            attrs = self._admission.attributes(instance)
            if instance.id in self._slot_of:
                raise RegistryError(f"instance `{instance.id}` is already registered; use update()")
            with self._read:
                self._insert(instance, attrs, score)

    def _insert(self, instance: Instance, attrs: Mapping[str, Scalar], score: float | None) -> None:
        slot = self._slots.take(self._index.shard_group(attrs))
        self._index.insert(slot, attrs)
        name = _gpu_group(instance)
        if score is None:
            score = self._tiers.score_of(name)
            score = DEFAULT_SCORE if score is None else score
        self._tiers.add(slot, instance.id, name, -score)
        self._slot_of[instance.id] = slot
        self._instance[slot] = instance
        self._place(slot, instance)
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
        score = self._group_score(slot)
        self._tiers.remove(slot)
        self._slots.give(slot)
        self._routable.discard(slot)
        del self._instance[slot]
        self._place(slot, None)
        self._scored.pop(slot, None)
        return score

    def add_many(self, instances: Iterable[Instance], scores: Mapping[str, float] | None = None) -> None:
        """Register many instances at once, all or nothing; into an empty registry this is
        the index build (postings built once per value rather than bit by bit)."""
        items = list(instances)
        scores = scores or {}
        with self._write, gc_paused():
            ids = [inst.id for inst in items]
            if len(set(ids)) != len(ids) or not self._slot_of.keys().isdisjoint(ids):
                seen: set[str] = set()
                for iid in ids:
                    if iid in self._slot_of or iid in seen:
                        raise RegistryError(f"instance `{iid}` is already registered; use update()")
                    seen.add(iid)
            given = [scores.get(iid) for iid in ids]
            checked = [s if s is None or type(s) is float and 0.0 <= s <= 1.0 else check_score(iid, s)
                       for iid, s in zip(ids, given)]
            admit = self._admission.attributes
            attrs = [admit(inst) for inst in items]
            with self._read:
                if self._slot_of:
                    for inst, a, s in zip(items, attrs, checked):
                        self._insert(inst, a, s)
                    return
                self._bulk(items, ids, attrs, checked)
        self._start_prebuild()

    def _bulk(self, items: list[Instance], ids: list[str], attrs: list[dict[str, Scalar]], scores: list[float | None]) -> None:
        """The index build: slots handed out a placement group at a time, then every map,
        postings bitmap, Bloom filter and score tier filled from whole lists. A group's
        score is the last one given to a member (as adding them one by one would leave
        it), `DEFAULT_SCORE` where none was."""
        by_group: dict[tuple, list[int]] = {}
        shard_group = self._index.shard_group
        for n, a in enumerate(attrs):
            key = shard_group(a)
            g = by_group.get(key)
            if g is None:
                g = by_group[key] = []
            g.append(n)
        slots = [0] * len(items)
        ranged = self._index.range_attrs
        for group, members in by_group.items():
            if ranged and len(members) > 1:  # within a group, slots in order of the range attributes
                members.sort(key=lambda n: _range_key(attrs[n], ranged))
            for n, slot in zip(members, self._slots.take_many(group, len(members))):
                slots[n] = slot
        self._slot_of = dict(zip(ids, slots))
        self._instance = dict(zip(slots, items))
        by = np.empty(max(1024, 2 * (max(slots, default=0) + 1)), dtype=object)
        # fromiter stores each object as it is; assigning the list would make numpy probe every
        # model for the array protocols (three failing pydantic look-ups each: ~1 s per 100,000)
        by[slots] = np.fromiter(items, dtype=object, count=len(items))
        self._by_slot = by
        self._routable = BitMap(s for s, inst in zip(slots, items) if inst.deployment.endpoint)
        names = [_gpu_group(inst) for inst in items]
        gscore: dict[tuple[str, str, str], float] = {}
        for name, s in zip(names, scores):
            if s is not None:
                gscore[name] = s
            elif name not in gscore:
                gscore[name] = DEFAULT_SCORE
        self._index.bulk(list(zip(slots, attrs)))
        self._tiers.bulk([(-gscore[name], name, iid, slot) for name, iid, slot in zip(names, ids, slots)])

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
            attrs = self._admission.attributes(instance)
            with self._read:
                score = self._delete(instance.id)
                self._insert(instance, attrs, None if _gpu_group(instance) in self._tiers.groups else score)

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
            keep: list[tuple[int, Mapping[str, Scalar]]] = []
            evicted: list[str] = []
            refused: list[str] = []
            admission = AdmissionCache(bundle)
            for iid, slot in self._slot_of.items():
                try:
                    keep.append((slot, admission.attributes(self._instance[slot])))
                except AdmissionError as e:
                    (evicted if evict_inadmissible else refused).append(iid if evict_inadmissible else f"{iid}: {e.problems[0]}")
            if refused:
                more = f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
                raise RegistryError("the new bundle does not admit registered instances: " + "; ".join(refused[:5]) + more)
            new_index.bulk(keep)
            parser = RequestParser(bundle)
            with self._read:
                self._index, self._parser, self._bundle = new_index, parser, bundle
                self._answers.clear()  # answers of the old index, whose versions the new one restarts
                self._seen = (-1, -1)
                self._models = _models(bundle)
                for iid in evicted:
                    self._forget(iid)
                self._admission = admission
        self._start_prebuild()
        return tuple(evicted)

    # ------------------------------------------------------------------ measuring
    @property
    def index(self) -> FleetIndex:
        """The current index (for benchmarks and tests; do not mutate)."""
        return self._index
