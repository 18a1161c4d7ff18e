"""The request path's memos (`candidate_rows.py`, `candidate_sets.py`) keep at most `limit`
entries and let go of the oldest, one per new entry: starting a memo over instead frees
every entry inside one request (~1 ms at 256 candidate sets)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def put_newest(memo: OrderedDict[K, V], key: K, value: V, limit: int) -> V:
    """Store `value` under `key` as the newest entry (a stale entry under `key` re-enters
    as the newest), first letting go of the oldest when `memo` is full; returns `value`."""
    memo.pop(key, None)
    if len(memo) >= limit:
        memo.popitem(last=False)
    memo[key] = value
    return value
