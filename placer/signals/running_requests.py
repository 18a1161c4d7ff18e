"""Running requests: the sequences a model server on a GPU is decoding in its batch, as the
server reports them (vLLM's `vllm:num_requests_running`, SGLang's `sglang:num_running_reqs`,
...), under the measured key `running`.

With continuous batching a new request shares every engine step with the running ones, and
each running sequence adds its decode to each step: `seconds_per_running` per running
request is added to the predicted queueing (a declared weight, by default 0.1 ms: the decode
cost per sequence per step fitted to vLLM here, `benchmarks/emulator_calibration.py`). A
GPU whose batch is fuller than `max_running` is refused (no bound by default: a server's
batch limit is its own, `--max-num-seqs`). A reading older than `max_age_s` is stale and
falls back to the model with a plan note (or is refused, `OnStale.EXCLUDE`).

This file and its line in `signals/__init__.py` are the whole of the signal."""

from __future__ import annotations

import math

import numpy as np

from ..framework import OnStale
from ..gauge_signal import GaugeSignal
from ..plan import Constraint


class RunningRequests(GaugeSignal):
    name = "running_requests"
    constraint = Constraint.RUNNING_REQUESTS
    key = "running"
    consumes = (key,)
    what = "running requests"

    def __init__(self, *, max_running: float = math.inf, seconds_per_running: float = 0.1e-3, max_age_s: float = 0.25,
                 on_stale: OnStale = OnStale.FALL_BACK) -> None:
        if not seconds_per_running >= 0:
            raise ValueError(f"running requests signal: seconds_per_running {seconds_per_running!r} must be non-negative")
        super().__init__(bound=max_running, max_age_s=max_age_s, on_stale=on_stale)
        self.seconds_per_running = seconds_per_running

    def settings(self) -> tuple:
        return (*super().settings(), self.seconds_per_running)

    def terms(self, value: np.ndarray) -> np.ndarray:
        return value * self.seconds_per_running
