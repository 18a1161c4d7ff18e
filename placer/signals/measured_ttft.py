"""Measured time to first token: the mean first-token time a model server on a GPU reports
for the requests it served (vLLM's `vllm:time_to_first_token_seconds` histogram, SGLang's
`sglang:time_to_first_token_seconds`: its `_sum` over its `_count`, the measured keys
`ttft_sum_s` and `ttft_count`).

The server's own first-token time already holds what the placer cannot model for it: its
class's real speed (a slower GPU in a heterogeneous pool), its batch, its queue. It is
added to the predicted queueing, so of two servers the one that has been answering first
tokens sooner ranks first; a GPU whose mean is over `max_ttft_s` is refused (no bound by
default). The mean is over the server's life (a histogram's sum and count are counters), so
it follows a change of load slowly; a server that has answered nothing yet has no value and
is left to the model. A reading older than `max_age_s` falls back with a plan note (or is
refused, `OnStale.EXCLUDE`).

This file and its line in `signals/__init__.py` are the whole of the signal."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..framework import OnStale
from ..gauge_signal import GaugeSignal
from ..plan import Constraint

SUM, COUNT = "ttft_sum_s", "ttft_count"


class MeasuredTtft(GaugeSignal):
    name = "measured_ttft"
    constraint = Constraint.MEASURED_TTFT
    key = SUM
    consumes = (SUM, COUNT)
    what = "measured mean TTFT"

    def __init__(self, *, max_ttft_s: float = math.inf, max_age_s: float = 0.25, on_stale: OnStale = OnStale.FALL_BACK) -> None:
        super().__init__(bound=max_ttft_s, max_age_s=max_age_s, on_stale=on_stale)

    def value(self, values: Mapping[str, float]) -> float | None:
        total, count = values.get(SUM), values.get(COUNT)
        if total is None or count is None or count == 0:
            return None
        return total / count if count > 0 else math.nan  # a negative count: unusable, stale

    def show(self, value: float) -> str:
        return f"{value * 1e3:.1f} ms"

    def terms(self, value: np.ndarray) -> np.ndarray:
        return value
