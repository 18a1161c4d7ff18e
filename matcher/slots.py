"""Slot allocation: each instance gets a small integer (its bit in every bitmap).

Slots are grouped into shards of `SHARD_SIZE`, and a shard is given to one placement group
(`FleetIndex.shard_group`: model, region, ... as the rules index them), so that the per-shard Bloom filters in `bloom.py` see few distinct keys and
can skip whole shards for selective requests. Freed slots are reused within their shard;
a shard left empty goes back to a pool any group may take.
"""

from __future__ import annotations

from typing import Hashable

from .bloom import SHARD_SIZE


class SlotAllocator:
    def __init__(self, shard_size: int = SHARD_SIZE) -> None:
        self.shard_size = shard_size
        self._open: dict[Hashable, list[int]] = {}  # group -> shards with free slots
        self._free: dict[int, list[int]] = {}  # shard -> free offsets (a stack)
        self._group: dict[int, Hashable] = {}
        self._empty: list[int] = []
        self._next = 0

    def _open_shard(self, group: Hashable) -> list[int]:
        shards = self._open.setdefault(group, [])
        if not shards:
            if self._empty:
                shard = self._empty.pop()
            else:
                shard, self._next = self._next, self._next + 1
                self._free[shard] = list(range(self.shard_size - 1, -1, -1))
            self._group[shard] = group
            shards.append(shard)
        return shards

    def take(self, group: Hashable) -> int:
        shards = self._open_shard(group)
        shard = shards[-1]
        free = self._free[shard]
        off = free.pop()
        if not free:
            shards.pop()
        return shard * self.shard_size + off

    def take_many(self, group: Hashable, n: int) -> list[int]:
        """The slots `n` calls of `take(group)` would give, in that order, a shard at a time."""
        out: list[int] = []
        while len(out) < n:
            shards = self._open_shard(group)
            shard = shards[-1]
            free = self._free[shard]
            m = min(n - len(out), len(free))
            base = shard * self.shard_size
            out.extend([base + off for off in reversed(free[len(free) - m:])])
            del free[len(free) - m:]
            if not free:
                shards.pop()
        return out

    def give(self, slot: int) -> None:
        shard, off = divmod(slot, self.shard_size)
        free = self._free[shard]
        free.append(off)
        group = self._group[shard]
        if len(free) == 1:
            self._open.setdefault(group, []).append(shard)
        if len(free) == self.shard_size:
            self._open[group].remove(shard)
            del self._group[shard]
            self._empty.append(shard)

    @property
    def shard_count(self) -> int:
        return self._next
