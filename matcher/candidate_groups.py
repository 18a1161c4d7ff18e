"""The groups among one candidate bitmap, kept while the fleet's membership stays the same.

A request shape's candidates (its plan's bitmap) change only when an instance is added or
removed, but their order changes with every score push: the decision service re-ranks
each shape it serves once a refresher tick. Ranking the candidates themselves costs a
gather per candidate and, with cold caches, 100-200 µs for a thousand of them. The groups
among them are far fewer (the instances of a model on one GPU share its score), and they
are the same until the membership changes, so `ScoreTiers` keeps them here per bitmap: a
re-rank reads each group's current -score (`neg_by_num`), orders the groups in numpy and
looks only at the first k. Which members of a picked group are candidates is found once
(a group's members are in id order, fixed with the membership too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pyroaring import BitMap

if TYPE_CHECKING:
    from .ranking import Group


class CandidateGroups:
    """For bitmap `cand` at membership version `members`: the numbers of the groups with at
    least one candidate (`nums`), and, filled as groups are picked, each one's candidate
    members in id order (`hits`)."""

    __slots__ = ("cand", "members", "nums", "hits")

    def __init__(self, cand: BitMap, members: int, nums: np.ndarray) -> None:
        self.cand = cand  # held, so that no other bitmap can take its id while this lives
        self.members = members
        self.nums = nums
        self.hits: dict[int, list[int]] = {}

    def members_of(self, g: Group) -> list[int]:
        """`g`'s candidate members, best (lowest id) first."""
        got = self.hits.get(g.num)
        if got is None:
            slots, cand = g.slots, self.cand
            got = self.hits[g.num] = slots if all(s in cand for s in slots) else [s for s in slots if s in cand]
        return got

    def first_of(self, g: Group) -> int:
        """`g`'s best candidate member."""
        got = self.hits.get(g.num)
        if got is not None:
            return got[0]
        s = g.slots[0]
        return s if s in self.cand else self.members_of(g)[0]
