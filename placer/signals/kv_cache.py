"""KV-cache use: the share of a model server's KV-cache blocks its running sequences hold
(vLLM's `vllm:kv_cache_usage_perc`, SGLang's `sglang:token_usage`, ...; 0 to 1), under the
measured key `kv_cache_usage`.

A server near full must preempt or queue a new request's blocks, so a nearly full cache
predicts waiting: `seconds_at_half` × u / (1 - u) is added to the predicted queueing (the
queueing model's shape for a utilisation u, `latency.gpu_queue`; u capped at 0.99), and a
GPU whose cache is fuller than `max_usage` (default 0.95) is refused, naming its use. A
reading older than `max_age_s`, or outside 0..1, is stale and falls back to the model with
a plan note (or is refused, `OnStale.EXCLUDE`).

The cache a request needs grows with its prompt; this signal is per tick (every request sees
the same use), so a long prompt is not yet held to a tighter bound than a short one.

This file and its line in `signals/__init__.py` are the whole of the signal."""

from __future__ import annotations

import numpy as np

from ..framework import OnStale
from ..gauge_signal import GaugeSignal
from ..latency import GPU_QUANTUM
from ..plan import Constraint


class KvCache(GaugeSignal):
    name = "kv_cache"
    constraint = Constraint.KV_CACHE
    key = "kv_cache_usage"
    consumes = (key,)
    what = "KV-cache use"
    top = 1.0

    def __init__(self, *, max_usage: float = 0.95, seconds_at_half: float = GPU_QUANTUM, max_age_s: float = 0.25,
                 on_stale: OnStale = OnStale.FALL_BACK) -> None:
        if not (0 <= max_usage <= 1 and seconds_at_half >= 0):
            raise ValueError(f"KV-cache signal: max_usage {max_usage!r} must be within 0..1 and seconds_at_half "
                             f"{seconds_at_half!r} non-negative")
        super().__init__(bound=max_usage, max_age_s=max_age_s, on_stale=on_stale)
        self.seconds_at_half = seconds_at_half

    def settings(self) -> tuple:
        return (*super().settings(), self.seconds_at_half)

    def show(self, value: float) -> str:
        return f"{value:.0%}"

    def terms(self, value: np.ndarray) -> np.ndarray:
        u = np.minimum(value, 0.99)
        return self.seconds_at_half * u / (1.0 - u)
