"""What the fleet store holds, by instance id, without an object per instance.

A replica remembers every instance the store holds, admitted or not (`Replica._known`:
to re-apply after a bundle change, an attestation or a compaction reload). At start that is
the whole snapshot, already held as columns (`InstanceBatch`); an `Instance` is made from
its row only when asked for (`__getitem__`), so a start with 100,000 instances makes none.
Later changes (watch events, this replica's writes) are kept as the objects they come as.
"""

from __future__ import annotations

from typing import Iterator, MutableMapping

from policyc.matcher import Instance
from policyc.matcher.columns import InstanceBatch

Entry = tuple[Instance, "float | None"]


class KnownInstances(MutableMapping[str, Entry]):
    """id -> (instance, score): rows of a batch until read or replaced, then objects."""

    __slots__ = ("_batch", "_rows", "_objects")

    def __init__(self, batch: InstanceBatch) -> None:
        self._batch = batch
        self._rows: dict[str, int] = {iid: i for i, iid in enumerate(batch.ids)}  # later rows of an id win
        self._objects: dict[str, Entry] = {}

    def __getitem__(self, iid: str) -> Entry:
        got = self._objects.get(iid)
        if got is not None:
            return got
        row = self._rows[iid]
        b = self._batch
        return b.instance(row), (b.scores[row] if b.scores else None)

    def __setitem__(self, iid: str, entry: Entry) -> None:
        self._rows.pop(iid, None)
        self._objects[iid] = entry

    def __delitem__(self, iid: str) -> None:
        if self._objects.pop(iid, None) is None:
            del self._rows[iid]

    def of_host(self, host: str) -> list[str]:
        """The ids of the instances on `host` (from the batch's host column: no object made
        for the rows of other hosts)."""
        hosts = self._batch.strs["host"]
        out = [iid for iid, row in self._rows.items() if hosts[row] == host]
        return out + [iid for iid, (inst, _) in self._objects.items() if inst.deployment.host == host]

    def __contains__(self, iid: object) -> bool:
        return iid in self._objects or iid in self._rows

    def __iter__(self) -> Iterator[str]:
        yield from list(self._rows)
        yield from list(self._objects)

    def __len__(self) -> int:
        return len(self._rows) + len(self._objects)
