"""Cross-layer correlation: which layer an anomaly belongs to, from the signals at hand.

Signals from different layers (kernel stream and handshake timings, gRPC status codes,
SM utilization from NVML or the simulator, RDMA watermarks) are merged per GPU; the
bundle's classifying breakers (`classify: client_network`, ...) name the cause when their
conditions hold together. A classification other than `model_fault` means the GPU is not to
blame: its fault streaks are not advanced and it is neither reported nor healed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policyc.compiler.bundle import Breaker
from policyc.enforcer.rule_table import all_hold

MODEL_FAULT = "model_fault"

# Signal names the enforcer understands; rules may name others, which then must be supplied.
SM_UTIL = "sm_utilization"  # fraction [0, 1]
TLS_HANDSHAKE = "tls_handshake"  # seconds
CONNECT_TIME = "connect_time"  # seconds
STREAM_TIME = "stream_time"  # seconds, from the kernel's HTTP/2 walker
ERROR_RATE = "error_rate"  # fraction of calls with a non-OK status
RDMA_WATERMARK = "rdma_watermark"  # fraction of the port buffer


@dataclass(frozen=True, slots=True)
class Classification:
    cause: str  # client_network, model_fault, ...
    rule: str
    signals: tuple[tuple[str, float], ...]

    @property
    def blames_gpu(self) -> bool:
        return self.cause == MODEL_FAULT


def classify(rules: tuple[Breaker, ...], signals: Mapping[str, float]) -> Classification | None:
    """The first non-model-fault classifying rule whose conditions all hold, most specific first.

    `model_fault` rules are the GPU fault rules themselves; they apply when nothing else explains
    the signals."""
    candidates = sorted((r for r in rules if r.classify and r.classify != MODEL_FAULT), key=lambda r: -len(r.conditions))
    for rule in candidates:
        if all_hold(rule, signals):
            used = tuple((c.signal, signals[c.signal]) for c in rule.conditions)
            return Classification(rule.classify or MODEL_FAULT, rule.name, used)
    return None
