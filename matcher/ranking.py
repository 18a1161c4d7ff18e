"""Best-k by score without materialising every match.

What is ranked is the **group**: the instances of one model on one GPU. They are copies of
one choice and share that GPU's score, which the placer pushes per GPU, so ranking groups
makes a score push one move per (model, GPU) instead of one per instance (about 50 per GPU
at 100,000 instances), and finding the best instance of each of the k best groups (what
the placer chooses among) a walk over groups rather than over every copy.

The order: groups by the key (-score, group name), higher score first, ties by name;
within a group its members by instance id. Instances are thus ordered by
(-score, group name, instance id).

The group key space is cut into tiers of at most `2 * TARGET` groups; each tier keeps its
groups in key order with their keys (and the keys' first halves, -score, as a flat array of
doubles to bisect), and one bitmap of all its groups' member slots. The tiers are kept in
key order, so everything in an earlier tier beats everything in a later one.

Best-k walks the tiers from the best, counting each tier's intersection with the candidate
bitmap (a cardinality only: building a result bitmap costs more than the count), then that
tier's groups, each by one count against the candidates (a membership test for a group of
one), and stops as soon as k are collected; nothing is sorted on the hot path. Candidate sets of at most `SMALL` slots are
ranked directly.

A batch of score changes (`move_many`) takes every moved group out first, then finds all
the new tiers in one `numpy.searchsorted` over the tiers' lowest scores (`lows`; names are
compared only where a score equals a tier's lowest), inserts, and splits the tiers that
grew past `2 * TARGET` last, so that the tier indices found stay valid while inserting.

Sparse candidates would make that walk visit hundreds of empty tiers (a fleet of 100,000
instances has about 1,600 tiers; a request for one model in one region with a security
flag keeps a few dozen candidates). So every tier also carries a `rank`, a float that
grows along the tier list (a split takes the midpoint of its neighbours; the ranks are
renumbered in the rare case a gap runs out), and every slot the rank of its tier
(`rank_of`, a numpy array; `threshold_ranks.py` reads it). Up to `DIRECT` candidates (up to
`DIRECT_MANY` for k > 1) are ranked by gathering their scores at once (`neg_of`, each
slot's group's -score): for k = 1 the lowest; for k > 1 one slot per candidate group
(`num_of`, each slot's group number), the groups sorted by score in numpy, and only the
first k groups read in Python. A walk over a larger candidate set that meets
`EMPTY_TIERS` empty tiers in a row switches to the same gather.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from operator import ne
from typing import Hashable

import numpy as np
from pyroaring import BitMap

from .candidate_groups import CandidateGroups

GroupKey = tuple[float, Hashable]  # (-score, group name)
TARGET = 64
SMALL = 6  # at most this many candidates: order them by key directly (`key_of`; numpy costs more below)
SMALL_ONE = 48  # the same for the best one alone (a `min` over keys; gathering ranks costs more below)
DIRECT = 256  # at most this many candidates: the best one found through their scores (`neg_of`), no walk
DIRECT_MANY = 2048  # the same for the best k > 1 (a walk over sparse candidates meets many tiers with one or none)
FEW = 4  # k = 1 and at most this many hits in the first tier that has any: ordered by key at once (at 32 the five-contract fleet, dense with hits in its first group, pays for the key look-ups: p50 2.7 -> 5.7 us)
EMPTY_TIERS = 16  # a walk that meets this many empty tiers in a row gathers ranks instead
RANK_GAP = 1024.0  # initial distance between tier ranks
VECTOR = 8  # batches of at least this many keys find their tiers with numpy (below, its call costs more)
DIGESTS = 1024  # candidate bitmaps whose groups are kept (`CandidateGroups`), least recently used out first
SPREAD = 16  # fewer candidates than groups / SPREAD: their groups found by a sort, not by a scan of every group number


class Group:
    """The members of one group in instance-id order (ids and slots as parallel lists), its
    key, and the tier that holds it; a group of several members also keeps them as a bitmap
    (`bm`, None for one member: a fleet of one instance per GPU would otherwise carry a
    bitmap object per instance)."""

    __slots__ = ("name", "num", "key", "ids", "slots", "bm", "tier")

    def __init__(self, name: Hashable, neg: float, ids: list[str], slots: list[int], num: int = 0) -> None:
        self.name = name
        self.num = num  # the group's number in `ScoreTiers.numbered` (its slots' entry in `num_of`)
        self.key: GroupKey = (neg, name)
        self.ids = ids
        self.slots = slots
        self.bm: BitMap | None = BitMap(slots) if len(slots) > 1 else None
        self.tier: Tier | None = None

    def join(self, slot: int, iid: str) -> None:
        i = bisect_left(self.ids, iid)
        self.ids.insert(i, iid)
        self.slots.insert(i, slot)
        if self.bm is not None:
            self.bm.add(slot)
        elif len(self.slots) > 1:
            self.bm = BitMap(self.slots)

    def leave(self, slot: int, iid: str) -> None:
        i = bisect_left(self.ids, iid)
        del self.ids[i], self.slots[i]
        if len(self.slots) <= 1:
            self.bm = None
        elif self.bm is not None:
            self.bm.discard(slot)


class Tier:
    """One tier: its groups in key order with their keys and the keys' first halves
    (-score) as a flat array of doubles, and the union of their members as a bitmap (for
    counting candidates). An update bisects the doubles (one contiguous block instead of a
    tuple and a float object per probe) and compares names only among equal scores."""

    __slots__ = ("bm", "groups", "keys", "negs", "rank")

    def __init__(self, groups: list[Group], keys: list[GroupKey] | None = None, negs: array | None = None,
                 rank: float = 0.0, members: list[int] | None = None) -> None:
        self.rank = rank
        self.groups = groups
        self.keys = [g.key for g in groups] if keys is None else keys
        self.negs = array("d", [k[0] for k in self.keys]) if negs is None else negs
        self.bm = BitMap([s for g in groups for s in g.slots] if members is None else members)
        for g in groups:
            g.tier = self

    def put(self, g: Group) -> None:
        """Insert `g` at its key's place."""
        negs = self.negs
        key = g.key
        neg = key[0]
        i = bisect_right(negs, neg)
        if i and negs[i - 1] == neg:  # equal scores: the names decide, among those only
            i = bisect_right(self.keys, key, bisect_left(negs, neg, 0, i), i)
        self.keys.insert(i, key)
        self.groups.insert(i, g)
        negs.insert(i, neg)
        if g.bm is None:
            self.bm.add(g.slots[0])
        else:
            self.bm |= g.bm
        g.tier = self

    def take(self, g: Group) -> None:
        """Take out `g` (with the key it was put in with)."""
        negs, keys = self.negs, self.keys
        key = g.key
        neg = key[0]
        i = bisect_left(negs, neg)
        if keys[i] is not key and keys[i] != key:  # equal scores before it: the names decide
            i = bisect_left(keys, key, i, bisect_right(negs, neg, i))
        del keys[i], self.groups[i], negs[i]
        if g.bm is None:  # one member, or none left
            for s in g.slots:
                self.bm.discard(s)
        else:
            self.bm -= g.bm
        g.tier = None


class ScoreTiers:
    """Groups in tiers by (-score, name); each instance slot found through `group_of`, its
    id the last item of its `key_of` entry. The registry calls it under its locks: nothing
    here is thread-safe."""

    __slots__ = ("bounds", "lows", "tiers", "groups", "group_of", "key_of", "rank_of", "neg_of", "num_of",
                 "numbered", "free_nums", "scratch", "neg_by_num", "members", "digests", "tier_at", "rank_version",
                 "version")

    def __init__(self) -> None:
        self.bounds: list[GroupKey] = [(-float("inf"), "")]  # each tier's lowest key
        self.lows = np.array([-np.inf])  # bounds' first halves (-score), for `_locate`
        self.tiers: list[Tier] = [Tier([])]
        self.groups: dict[Hashable, Group] = {}
        self.group_of: dict[int, Group] = {}  # slot -> its group
        self.key_of: dict[int, tuple] = {}  # slot -> (-score, group name, instance id), its place in the order
        self.rank_of = np.zeros(1024)  # slot -> its tier's rank (free slots: stale, never read)
        self.neg_of = np.zeros(1024)  # slot -> its group's -score, the order's first half (free slots: stale)
        self.num_of = np.zeros(1024, dtype=np.int64)  # slot -> its group's number (free slots: stale)
        self.numbered: list[Group | None] = []  # group number -> group (None: free)
        self.free_nums: list[int] = []  # numbers of groups that are gone, to give out again
        self.scratch = np.full(0, -1, dtype=np.int64)  # group number -> -1 between calls (`_groups_among`)
        self.neg_by_num = np.zeros(1024)  # group number -> the group's -score (free numbers: stale)
        self.members = 0  # bumped by every change of membership (`CandidateGroups` are kept on it)
        self.digests: OrderedDict[int, CandidateGroups] = OrderedDict()  # id(bitmap) -> its groups
        self.tier_at: dict[float, Tier] = {0.0: self.tiers[0]}  # rank -> tier
        self.rank_version = 0  # bumped whenever a live slot's rank changes (`threshold_ranks.py` caches on it)
        self.version = 0  # bumped by every change to the order (an answer cached at another version is stale)

    # ------------------------------------------------------------------ tier ranks
    def _mark(self, slots: list[int], rank: float) -> None:
        ro = self.rank_of = _fitting(self.rank_of, max(slots))
        changed = False
        for s in slots:
            if ro[s] != rank:  # a group moved within its tier keeps its rank: cached ranks stay valid
                ro[s] = rank
                changed = True
        if changed:
            self.rank_version += 1

    def _score(self, slots: list[int], neg: float) -> None:
        no = self.neg_of = _fitting(self.neg_of, max(slots))
        for s in slots:
            no[s] = neg

    def _number(self, g: Group, slot: int) -> None:
        """Record `slot` as a member of `g` in `num_of`."""
        nums = self.num_of = _fitting(self.num_of, slot)
        nums[slot] = g.num

    def _new_group(self, name: Hashable, neg: float, iid: str, slot: int) -> Group:
        """A group of one, numbered with a free number (so numbers stay below the most
        groups there ever were at once)."""
        if self.free_nums:
            g = Group(name, neg, [iid], [slot], self.free_nums.pop())
            self.numbered[g.num] = g
        else:
            g = Group(name, neg, [iid], [slot], len(self.numbered))
            self.numbered.append(g)
        negs = self.neg_by_num = _fitting(self.neg_by_num, g.num)
        negs[g.num] = neg
        return g

    def _renumber(self) -> None:
        """Give the tiers evenly spaced ranks again (a split found no room between two)."""
        for i, tier in enumerate(self.tiers):
            tier.rank = i * RANK_GAP
            for g in tier.groups:
                self._mark(g.slots, tier.rank)
        self.tier_at = {tier.rank: tier for tier in self.tiers}
        self.rank_version += 1

    def add(self, slot: int, iid: str, name: Hashable, neg: float) -> None:
        """Add instance `slot` (id `iid`) to group `name`, whose key becomes (`neg`, `name`)
        (moving the group if it had another score)."""
        self.version += 1
        self.members += 1
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = self._new_group(name, neg, iid, slot)
            self.key_of[slot] = (neg, name, iid)
            self.group_of[slot] = g
            self._number(g, slot)
            t = bisect_right(self.bounds, g.key) - 1
            self.tiers[t].put(g)
            self._mark(g.slots, self.tiers[t].rank)
            self._score(g.slots, neg)
            if len(self.tiers[t].groups) > 2 * TARGET:
                self._split(t)
            return
        g.join(slot, iid)
        self.key_of[slot] = g.key + (iid,)
        assert g.tier is not None
        g.tier.bm.add(slot)
        self._mark([slot], g.tier.rank)
        self._score([slot], g.key[0])
        self.group_of[slot] = g
        self._number(g, slot)
        if g.key[0] != neg:
            self.move_many([(name, neg)])

    def remove(self, slot: int) -> None:
        """Take instance `slot` out of its group; a group left empty is gone."""
        self.version += 1
        self.members += 1
        g = self.group_of.pop(slot)
        g.leave(slot, self.key_of.pop(slot)[2])
        assert g.tier is not None
        g.tier.bm.discard(slot)
        if not g.slots:
            g.tier.take(g)
            del self.groups[g.name]
            self.numbered[g.num] = None
            self.free_nums.append(g.num)

    def score_of(self, name: Hashable) -> float | None:
        g = self.groups.get(name)
        return None if g is None else -g.key[0]

    def move_many(self, moves: list[tuple[Hashable, float]]) -> list[Group]:
        """Give each group (existing, and distinct within `moves`) the key (-score, name)
        for its new `-score`; returns the groups that moved (an unchanged score costs
        nothing)."""
        groups = self.groups
        key_of = self.key_of
        moved: list[Group] = []
        for name, neg in moves:
            g = groups[name]
            if g.key[0] == neg:
                continue
            assert g.tier is not None
            g.tier.take(g)
            name = g.name  # the group's own: a caller's equal copy is a new tuple the collector must track
            g.key = (neg, name)
            self.neg_by_num[g.num] = neg
            for s, iid in zip(g.slots, g.ids):
                key_of[s] = (neg, name, iid)
            self._score(g.slots, neg)
            moved.append(g)
        if not moved:
            return moved
        self.version += 1
        tiers = self.tiers
        grown: set[int] = set()
        limit = 2 * TARGET
        for g, t in zip(moved, self._locate([g.key for g in moved])):
            tier = tiers[t]
            tier.put(g)
            self._mark(g.slots, tier.rank)
            if len(tier.groups) > limit:
                grown.add(t)
        for t in sorted(grown, reverse=True):  # from the last: a split shifts only later indices
            self._split(t)
        return moved

    def _locate(self, keys: list[GroupKey]) -> list[int]:
        """The tier each key belongs in (`bisect_right(bounds, key) - 1` for each): the
        scores are searched in `lows` at once, the names only where a score ties a bound."""
        bounds = self.bounds
        if len(keys) < VECTOR:
            return [bisect_right(bounds, key) - 1 for key in keys]
        lows = self.lows
        negs = np.array([key[0] for key in keys])
        where = np.searchsorted(lows, negs, side="right") - 1  # >= 0: lows[0] is -inf
        out: list[int] = where.tolist()
        ties = np.flatnonzero(lows[where] == negs)
        if len(ties):
            firsts = np.searchsorted(lows, negs[ties], side="left").tolist()
            for n, lo in zip(ties.tolist(), firsts):
                out[n] = bisect_right(bounds, keys[n], lo, out[n] + 1) - 1
        return out

    def _split(self, t: int) -> None:
        """Move the upper half of tier `t` into a new tier after it; halves still over
        `2 * TARGET` (a batch can grow a tier by more than one) are split again."""
        tier = self.tiers[t]
        mid = len(tier.groups) // 2
        after = self.tiers[t + 1].rank if t + 1 < len(self.tiers) else tier.rank + 2 * RANK_GAP
        rank = (tier.rank + after) / 2
        moved = Tier(tier.groups[mid:], tier.keys[mid:], tier.negs[mid:], rank)
        del tier.groups[mid:], tier.keys[mid:], tier.negs[mid:]
        tier.bm -= moved.bm
        self.tiers.insert(t + 1, moved)
        if tier.rank < rank < after:
            self.tier_at[rank] = moved
            for g in moved.groups:
                self._mark(g.slots, rank)
        else:  # no float left between the two ranks
            self._renumber()
        self.bounds.insert(t + 1, moved.keys[0])
        self.lows = np.insert(self.lows, t + 1, moved.keys[0][0])
        if len(moved.groups) > 2 * TARGET:
            self._split(t + 1)
        if len(tier.groups) > 2 * TARGET:
            self._split(t)

    def bulk(self, entries: list[tuple[float, Hashable, str, int]]) -> None:
        """Replace the contents at once (index build) from (-score, group name, instance id,
        slot) entries; the members of a group must share its -score."""
        entries = sorted(entries)
        self.bulk_sorted(np.array([e[0] for e in entries], dtype=np.float64), [e[1] for e in entries],
                         [e[2] for e in entries], [e[3] for e in entries])

    def bulk_sorted(self, negs: np.ndarray, names: list[Hashable], ids: list[str], slot_list: list[int]) -> None:
        """`bulk` from columns already in the order (-score, group name, instance id): the
        registry's build sorts a million entries with numpy on the names' parts (a Python
        sort of the tuples alone took ~1 s there). What is per instance is made by whole
        columns (the dicts by `zip`, the slot arrays by fancy indexing); only the groups
        are made one by one. A group's members must be adjacent and share its -score
        (ValueError otherwise, naming the group). `slot_list`: Python ints, kept as they
        are (the registry's own: a million more int objects would be 32 MB)."""
        n = len(names)
        if not (len(negs) == len(ids) == len(slot_list) == n):
            raise ValueError("bulk_sorted: columns of different lengths")
        neg_list = negs.tolist()
        slots = np.array(slot_list, dtype=np.int64)
        if n:
            starts_mask = np.ones(n, dtype=bool)
            starts_mask[1:] = np.fromiter(map(ne, names[1:], names[:-1]), dtype=bool, count=n - 1)
            inner = np.flatnonzero(~starts_mask)
            bad = inner[negs[inner] != negs[inner - 1]]
            if len(bad):
                i = int(bad[0])
                raise ValueError(f"group {names[i]!r}: members with different scores ({-neg_list[i - 1]} and {-neg_list[i]})")
        else:
            starts_mask = np.zeros(0, dtype=bool)
        starts = np.flatnonzero(starts_mask).tolist()
        nums = np.cumsum(starts_mask) - 1  # each entry's group number: groups numbered in key order
        groups: dict[Hashable, Group] = {}
        numbered: list[Group] = []
        for num, (a, b) in enumerate(zip(starts, starts[1:] + [n])):
            name = names[a]
            was = groups.get(name)
            if was is not None:  # sorted by -score first: a group's members with two scores fall apart
                if was.key[0] != neg_list[a]:
                    raise ValueError(f"group {name!r}: members with different scores ({-was.key[0]} and {-neg_list[a]})")
                raise ValueError(f"group {name!r}: members not adjacent (entries out of order)")
            g = groups[name] = Group(name, neg_list[a], ids[a:b], slot_list[a:b], num)
            numbered.append(g)
        self.groups = groups
        self.group_of = dict(zip(slot_list, map(numbered.__getitem__, nums.tolist())))
        self.key_of = dict(zip(slot_list, zip(neg_list, names, ids)))
        count = len(numbered)
        bounds_at = starts + [n]
        tiers = []
        for t, i in enumerate(range(0, max(count, 1), TARGET)):
            members = slot_list[bounds_at[i]:bounds_at[min(i + TARGET, count)]] if count else []
            tiers.append(Tier(numbered[i:i + TARGET], rank=t * RANK_GAP, members=members))
        self.tiers = tiers
        self.bounds = [(-float("inf"), "")] + [tier.keys[0] for tier in self.tiers[1:]]
        self.lows = np.array([b[0] for b in self.bounds])
        size = max(1024, 2 * (int(slots.max()) + 1) if n else 0)
        ro = np.zeros(size)
        ro[slots] = (nums // TARGET) * RANK_GAP
        self.rank_of = ro
        no = np.zeros(size)
        no[slots] = negs
        self.neg_of = no
        num_of = np.zeros(size, dtype=np.int64)
        num_of[slots] = nums
        self.num_of = num_of
        self.numbered = list(numbered)
        self.free_nums = []
        by_num = np.zeros(max(1024, 2 * count))
        by_num[:count] = negs[np.flatnonzero(starts_mask)]
        self.neg_by_num = by_num
        self.members += 1
        self.tier_at = {tier.rank: tier for tier in self.tiers}
        self.rank_version += 1
        self.version += 1

    def order_key(self, slot: int) -> tuple[float, Hashable, str]:
        """`slot`'s place in the order: (-score, group name, instance id)."""
        return self.key_of[slot]

    def best(self, cand: BitMap, count: int, k: int) -> list[int]:
        """The k best slots of `cand` (which holds `count` slots), best first."""
        if k <= 0 or count == 0:
            return []
        if count <= SMALL or k == 1 and count <= SMALL_ONE:
            key = self.key_of.__getitem__
            arr = cand.to_array()  # iterating a BitMap costs far more than an array
            return [min(arr, key=key)] if k == 1 else heapq.nsmallest(k, arr, key=key)
        if count > (DIRECT if k == 1 else DIRECT_MANY):
            got = self._walk(cand, k)
            if got is not None:
                return got
        return self._gathered(cand, k, False)

    def best_distinct(self, cand: BitMap, count: int, k: int) -> list[int]:
        """The best slot of each of the k best groups among `cand`, best first: the slots of
        one group would otherwise fill the k places with copies of one choice."""
        if k <= 0 or count == 0:
            return []
        if count <= SMALL:
            return self._one_per_group(sorted(cand.to_array(), key=self.key_of.__getitem__), k)
        if count > (DIRECT if k == 1 else DIRECT_MANY):
            walked = self._walk_distinct(cand, k)
            if walked is not None:
                return walked
        return self._gathered(cand, k, True)

    def _gathered(self, cand: BitMap, k: int, distinct: bool) -> list[int]:
        """Best-k through the candidates' scores: for k = 1 the lowest -score among them
        (`neg_of`); for more, through their groups (`_groups_among`, kept per bitmap while
        the membership stays): the groups' current -scores (`neg_by_num`) ordered in
        numpy, then only the first k groups (and those tying the k-th) read in Python, put
        in key order by name where scores tie, and their candidate members taken in id
        order. Every member of a group ties every other, so ordering the candidates
        themselves sorts each group's members by key: ~0.4 µs a candidate in Python."""
        if k == 1:
            idx = np.frombuffer(cand.to_array(), dtype=np.uint32)
            negs = self.neg_of[idx]
            return [min(idx[negs == negs.min()].tolist(), key=self.key_of.__getitem__)]
        among = self._groups_among(cand)
        nums = among.nums
        negs = self.neg_by_num[nums]
        if len(negs) > 4 * k:  # only the k best (and their ties) need an order
            kth = np.partition(negs, k - 1)[k - 1]
            pick = np.flatnonzero(negs <= kth)
            nums, negs = nums[pick], negs[pick]
        order = np.argsort(negs, kind="stable")
        ranked = negs[order]
        end = len(ranked) if len(ranked) <= k else int(np.searchsorted(ranked, ranked[k - 1], side="right"))
        numbered = self.numbered
        picked = [numbered[n] for n in nums[order[:end]].tolist()]
        if end > 1 and bool((ranked[1:end] == ranked[:end - 1]).any()):  # equal scores: the names decide
            picked.sort(key=_group_key)
        got: list[int] = []
        for g in picked:
            assert g is not None  # a candidate's group is live
            if distinct:
                got.append(among.first_of(g))
            else:
                got.extend(among.members_of(g)[:k - len(got)])
            if len(got) == k:
                break
        return got

    def _groups_among(self, cand: BitMap) -> CandidateGroups:
        """The groups among `cand`, as kept since the last membership change, else found:
        each candidate's group number (`num_of`) scattered into `scratch` (a group number
        -> slot array that is all -1 between calls) leaves one entry per group; a few
        candidates among many groups (a fleet of one instance per GPU has as many groups
        as instances) sort their numbers instead of scanning every group's entry."""
        digests = self.digests
        key = id(cand)
        got = digests.get(key)
        if got is not None and got.cand is cand and got.members == self.members:
            digests.move_to_end(key)
            return got
        idx = np.frombuffer(cand.to_array(), dtype=np.uint32)
        if len(idx) * SPREAD < len(self.numbered):  # few candidates among many groups: sorting them costs less
            nums = np.unique(self.num_of[idx])
        else:
            scratch = self.scratch
            if len(scratch) < len(self.numbered):
                scratch = self.scratch = np.full(2 * len(self.numbered), -1, dtype=np.int64)
            scratch[self.num_of[idx]] = idx
            nums = np.flatnonzero(scratch >= 0)
            scratch[nums] = -1
        got = digests[key] = CandidateGroups(cand, self.members, nums)
        digests.move_to_end(key)
        if len(digests) > DIGESTS:
            digests.popitem(last=False)
        return got

    def _one_per_group(self, slots: list[int], k: int) -> list[int]:
        """The first slot of each group among `slots` (best first), up to k."""
        got: list[int] = []
        seen: set[Hashable] = set()
        group_of = self.group_of
        for s in slots:
            name = group_of[s].name
            if name not in seen:
                seen.add(name)
                got.append(s)
                if len(got) == k:
                    break
        return got

    def _walk(self, cand: BitMap, k: int) -> list[int] | None:
        """Best-k by walking the tiers from the best (dense candidates find k in the first
        few); None after `EMPTY_TIERS` empty tiers (sparse ones: gather instead)."""
        got: list[int] = []
        need = k
        empty = 0
        for tier in self.tiers:
            n = tier.bm.intersection_cardinality(cand)  # no bitmap built: a count only
            if not n:
                empty += 1
                if empty >= EMPTY_TIERS:
                    return None
                continue
            if k == 1 and n <= FEW:  # the best of a few hits by key: no walk over the tier's groups
                return [min((tier.bm & cand).to_array(), key=self.key_of.__getitem__)]
            for g in tier.groups:
                bm = g.bm
                if bm is None:  # one member: a membership test costs less than a count
                    s = g.slots[0]
                    if s in cand:
                        got.append(s)
                        need -= 1
                        if not need:
                            return got
                        n -= 1
                        if not n:
                            break
                    continue
                m = bm.intersection_cardinality(cand)
                if not m:
                    continue
                order = g.slots
                hits = order if m == len(order) else [s for s in order if s in cand]
                if m >= need:
                    got.extend(hits[:need])
                    return got
                got.extend(hits)
                need -= m
                n -= m
                if not n:
                    break
        return got

    def _walk_distinct(self, cand: BitMap, k: int) -> list[int] | None:
        got: list[int] = []
        empty = 0
        for tier in self.tiers:
            n = tier.bm.intersection_cardinality(cand)
            if not n:
                empty += 1
                if empty >= EMPTY_TIERS:
                    return None
                continue
            for g in tier.groups:
                bm = g.bm
                if bm is None:  # one member
                    s = g.slots[0]
                    if s not in cand:
                        continue
                    m = 1
                else:
                    m = bm.intersection_cardinality(cand)
                    if not m:
                        continue
                    order = g.slots
                    s = order[0] if m == len(order) else next(x for x in order if x in cand)
                got.append(s)
                if len(got) == k:
                    return got
                n -= m
                if not n:
                    break
        return got


def _group_key(g: Group | None) -> GroupKey:
    assert g is not None
    return g.key


def _fitting(a: np.ndarray, top: int) -> np.ndarray:
    """`a`, or a copy at least twice as long (zeros after) when slot `top` is past its end."""
    if top < len(a):
        return a
    grown = np.zeros(max(2 * len(a), top + 1), dtype=a.dtype)
    grown[:len(a)] = a
    return grown
