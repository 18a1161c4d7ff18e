"""Each candidate instance's GPU row in the topology, remembered per instance object.

The decision service hands the placer the matcher's registered `Instance` objects, the
same objects request after request. Finding a candidate's row afresh (two pydantic
attribute reads, a (host, gpu) tuple, a lookup in a dict of every GPU keyed by strings)
costs ~2 µs a candidate once those objects have left the CPU cache: with 64 candidates
more than the whole table gather. Instances and their deployments are frozen, so an
object's row holds for as long as the topology does.

The memo is keyed by `id(instance)` (an int: nothing of the instance is read on a hit)
and each entry keeps the instance itself, so an id cannot be reused by another object
while its entry lives; a hit is only taken when the entry's object *is* the candidate.
The memo belongs to one topology and is replaced when the topology changes; past `limit`
entries the oldest is let go, one per new entry (so instances that left the registry are
let go in time, and no request pays for freeing the whole memo at once).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from policyc.matcher.instance import Instance

from .oldest_first import put_newest
from .topology import Topology

DEFAULT_LIMIT = 1 << 18  # instances remembered per topology


class CandidateRows:
    """`rows(topology, candidates)` -> (rows, the candidates with a row, those without)."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._memo: tuple[Topology | None, OrderedDict[int, tuple[Instance, int | None]]] = (None, OrderedDict())

    def rows(self, topology: Topology, candidates: Sequence[Instance]) -> tuple[list[int], list[Instance], list[Instance]]:
        topo, seen = self._memo
        if topo is not topology:
            seen = OrderedDict()
            self._memo = (topology, seen)  # one assignment: a racing reader sees the old pair or the new one
        index = topology.gpu_index
        rows: list[int] = []
        known: list[Instance] = []
        unknown: list[Instance] = []
        for inst in candidates:
            hit = seen.get(id(inst))
            if hit is None or hit[0] is not inst:
                d = inst.deployment
                hit = (inst, index.get((d.host, d.gpu)))
                put_newest(seen, id(inst), hit, self._limit)
            row = hit[1]
            if row is None:
                unknown.append(inst)
            else:
                rows.append(row)
                known.append(inst)
        return rows, known, unknown


__all__ = ["CandidateRows"]
