"""Anomaly reports from outside the collector (the enforcer's guardian), folded into GPU
health on the next tick.

A guardian sees things telemetry cannot: a request that blew its budget on this GPU, an
SM-utilisation anomaly it classified as a model or hardware fault. Each report lowers the
GPU's health multiplier; health recovers slowly while no new report arrives, so one
glitch does not exile a GPU forever and a repeating fault keeps it out.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

PENALTY = 0.3  # health multiplier lost per report
RECOVERY = 0.02  # regained per tick without reports


@dataclass(frozen=True, slots=True)
class AnomalyReport:
    gpu: int
    signal: str
    value: float


class AnomalyBoard:
    """Thread-safe: the guardian reports from its thread, the refresher folds in its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[AnomalyReport] = []
        self._health: np.ndarray | None = None
        self.last: dict[int, AnomalyReport] = {}

    def report(self, gpu: int, signal: str, value: float) -> None:
        with self._lock:
            self._pending.append(AnomalyReport(gpu, signal, float(value)))

    def fold(self, n_gpus: int) -> np.ndarray:
        """The health multiplier per GPU for this tick (1.0: no recent anomaly)."""
        with self._lock:
            pending, self._pending = self._pending, []
        if self._health is None or len(self._health) != n_gpus:
            self._health = np.ones(n_gpus)
        h = np.minimum(self._health + RECOVERY, 1.0)
        for r in pending:
            if 0 <= r.gpu < n_gpus:
                h[r.gpu] = max(0.0, h[r.gpu] - PENALTY)
                self.last[r.gpu] = r
        self._health = h
        out = h.copy()
        out.setflags(write=False)
        return out
