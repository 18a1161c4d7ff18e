"""Prefix-cache affinity: send a prompt to the server that served its leading blocks, until
that server saturates ("sticky until saturated", as llm-d's router does).

A model server with prefix caching (vLLM's automatic prefix caching, the emulator's) skips
the prefill of a prompt's leading blocks it still holds: a request whose system prompt the
server saw a moment ago starts sooner there. The placer cannot read a server's cache, so it
remembers where it sent each prefix (`PrefixIndex`: the chained hash of each of a prompt's
leading blocks, `request_facts.prefix_blocks`, mapped to the GPUs that served it, most
recent first, bounded), the Inference Extension's approximate prefix-cache scorer.

At the pick (`Picker.choose`, request stage like `gateway_in_flight`: the index moves at
every pick, not once per tick), each feasible candidate's matched share of the prompt is
the number of leading blocks it served, consecutively from the first, over the prompt's
blocks; its rank is lowered by that share of the prompt's predicted prefill on its GPU
(`predicted_ttft.prefill_seconds`: the seconds the cache saves there), so the affinity is
worth what it saves, in the rank's own unit. A candidate is saturated — no affinity credit —
when its server's measured waiting queue is at least `max_waiting` or its KV cache at least
`max_kv` (fresh readings only: a stale one counts as not saturated, the gateway's in-flight
count still prices the load), or when this gateway has `max_in_flight` of its own requests
in flight there. It never refuses a GPU. The chosen GPU is then recorded for the prompt's
blocks (`record`).

Bounded: at most `max_blocks` block hashes are remembered (least recently used forgotten
first), each with at most `per_block` GPUs. Thread-safe (the picker calls it under the
placer's lock; `record` takes its own).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from ..framework import Column, RequestInputs, Signal, Words
from ..framework import Stage
from ..plan import Constraint
from ..readings import Reading, Readings
from ..readings import fresh as is_fresh

KEY = "prefix_affinity"
WAITING, KV = "queue_depth", "kv_cache_usage"


class PrefixIndex:
    """Block hash -> the GPU keys that served a prompt with it, most recent first."""

    def __init__(self, *, max_blocks: int = 200_000, per_block: int = 4) -> None:
        if max_blocks < 1 or per_block < 1:
            raise ValueError(f"prefix index: max_blocks {max_blocks!r} and per_block {per_block!r} must be at least 1")
        self.max_blocks, self.per_block = max_blocks, per_block
        self._lock = threading.Lock()
        self._gpus: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._gpus)

    def record(self, blocks: Sequence[int], gpu: str) -> None:
        """`gpu` served a prompt opening with `blocks`."""
        with self._lock:
            d = self._gpus
            for h in blocks:
                had = d.get(h)
                if had is not None and had[0] == gpu:  # already its most recent: only the block's recency moves
                    d.move_to_end(h)
                    continue
                had = d.pop(h, ())
                d[h] = (gpu, *(g for g in had if g != gpu))[:self.per_block]
            while len(d) > self.max_blocks:
                d.popitem(last=False)

    def matched(self, blocks: Sequence[int], gpus: Sequence[str]) -> np.ndarray:
        """Per GPU key of `gpus`: how many of `blocks`, consecutively from the first, it served."""
        out = np.zeros(len(gpus), dtype=np.float64)
        held = self.held(blocks)
        if held:
            for i, g in enumerate(gpus):
                out[i] = held.get(g, 0)
        return out

    def held(self, blocks: Sequence[int]) -> dict[str, int]:
        """Per GPU key that served `blocks[0]`: how many of `blocks`, consecutively from the
        first, it served (at most `per_block` keys; the pick spreads them over its rows)."""
        held: dict[str, int] = {}
        if not blocks:
            return held
        n = len(blocks)
        with self._lock:
            get = self._gpus.get
            for g in get(blocks[0], ()):  # a GPU that served the first block: how far its run goes
                depth = 1
                while depth < n and g in get(blocks[depth], ()):
                    depth += 1
                held[g] = depth
        return held


class PrefixAffinity(Signal[RequestInputs]):
    name = "prefix_affinity"
    constraint = Constraint.PREFIX_AFFINITY
    consumes = (WAITING, KV, "gateway_in_flight")
    stage = Stage.REQUEST  # read at the pick, from the live index (`Picker.choose`)

    def __init__(self, *, max_waiting: float = 2.0, max_kv: float = 0.8, max_in_flight: float = 8.0,
                 max_age_s: float = 0.25) -> None:
        if not (max_waiting > 0 and 0 < max_kv <= 1 and max_in_flight > 0 and max_age_s > 0):
            raise ValueError(f"prefix affinity: max_waiting {max_waiting!r}, max_in_flight {max_in_flight!r} and "
                             f"max_age_s {max_age_s!r} must be positive, max_kv {max_kv!r} in (0, 1]")
        self.max_waiting, self.max_kv, self.max_in_flight, self.max_age_s = max_waiting, max_kv, max_in_flight, max_age_s

    def reference(self, x: RequestInputs) -> Column:
        """It never refuses: the affinity only orders the feasible candidates at the pick."""
        return Column(fail=np.zeros(len(x.total), dtype=bool))

    def saturated(self, readings: Readings, gpus: Sequence[str], in_flight: np.ndarray) -> np.ndarray:
        """Per GPU key: whether its server is too busy to keep the affinity (see the module)."""
        out = in_flight >= self.max_in_flight
        for i, g in enumerate(gpus):
            r = readings.get(g)
            if r is None or not is_fresh(r, self.max_age_s):  # the bound follows the scraper's tick in use
                continue
            w, kv = r.values.get(WAITING), r.values.get(KV)
            if (w is not None and w >= self.max_waiting) or (kv is not None and kv >= self.max_kv):
                out[i] = True
        return out

    def saturated_at(self, fresh: Sequence[tuple[int, Reading]], in_flight: np.ndarray) -> np.ndarray:
        """`saturated` with the readings already found: `fresh`, (candidate position, its
        reading) for the candidates that have one (the pick finds them once for both uses)."""
        out = in_flight >= self.max_in_flight
        for i, r in fresh:
            if not is_fresh(r, self.max_age_s):
                continue
            w, kv = r.values.get(WAITING), r.values.get(KV)
            if (w is not None and w >= self.max_waiting) or (kv is not None and kv >= self.max_kv):
                out[i] = True
        return out

    def credit(self, matched: np.ndarray, blocks: int, prefill: np.ndarray, saturated: np.ndarray) -> np.ndarray:
        """Seconds taken off each candidate's rank (vectorised): its matched share of the
        prompt's blocks times the prompt's predicted prefill there, none where saturated."""
        if blocks <= 0:
            return np.zeros(len(matched))
        return np.where(saturated, 0.0, matched / blocks * prefill)

    def credit_reference(self, matched: Sequence[float], blocks: int, prefill: Sequence[float],
                         saturated: Sequence[bool]) -> list[float]:
        """`credit`, candidate by candidate (the test holds the two equal)."""
        return [0.0 if blocks <= 0 or s else m / blocks * p for m, p, s in zip(matched, prefill, saturated)]

    def detail(self, w: Words, r: int) -> str:
        return "prefix affinity never refuses a GPU"

    def note(self, gpu: str, matched: float, blocks: int, credit: float) -> str:
        """The plan's line when the affinity moved the choice."""
        return (f"prefix affinity: {gpu} served {matched:g} of this prompt's {blocks} leading blocks "
                f"(-{credit * 1e3:.1f} ms of prefill it holds)")


__all__ = ["KEY", "PrefixAffinity", "PrefixIndex"]
