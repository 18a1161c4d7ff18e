"""The latency model: how telemetry becomes predicted seconds and their spread.

Each term is a small queueing estimate, vectorised over numpy arrays:
- a buffer at watermark w drains in `w * buffer / bandwidth` (its queueing delay), and its
  delay varies like an M/M/1 queue's, growing as w / (1 - w): a port at 89 % is not only
  slower but far less predictable, which is why stable paths win;
- a GPU at utilisation rho adds `quantum * rho / (1 - rho)` of kernel-scheduling wait;
- compute is `policyc.compiler.meaning.compute_seconds` on the share the GPU can give (at
  least the bundle's lower bound, at most its free capacity).
Observed volatility (EWMA standard deviation of the signal between ticks) widens sigma
further: a GPU whose load swings is riskier than its mean says.
"""

from __future__ import annotations

import numpy as np

GPU_QUANTUM = 2e-3  # seconds: kernel time-slice a request waits per unit of rho/(1-rho)
PAYLOAD = 256e3  # bytes moved per request over the network and PCIe
PCIE_BANDWIDTH = 25e9  # bytes/s, PCIe gen4 x16 effective
CROSS_NUMA_PENALTY = 50e-6  # seconds: socket interconnect + remote memory for the DMA
RHO_CAP = 0.95
WM_CAP = 0.99
VOLATILITY_GAIN_GPU = 20 * GPU_QUANTUM  # sigma seconds per unit of SM-utilisation std
VOLATILITY_GAIN_PORT = 4.0  # sigma as multiple of drain time per unit of watermark std


def buffer_delay(watermark: np.ndarray, buffer: np.ndarray | float, bandwidth: np.ndarray | float) -> np.ndarray:
    return np.clip(watermark, 0.0, WM_CAP) * buffer / bandwidth


def buffer_sigma(watermark: np.ndarray, buffer: np.ndarray | float, bandwidth: np.ndarray | float) -> np.ndarray:
    w = np.clip(watermark, 0.0, WM_CAP)
    return 0.5 * (buffer / bandwidth) * w / (1.0 - w)


def serialization_delay(util: np.ndarray, bandwidth: np.ndarray | float) -> np.ndarray:
    u = np.clip(util, 0.0, RHO_CAP)
    return PAYLOAD / bandwidth / (1.0 - u)


def gpu_queue(rho: np.ndarray) -> np.ndarray:
    r = np.minimum(np.maximum(rho, 0.0), RHO_CAP)  # np.clip's result, without its per-call overhead (hot path)
    return GPU_QUANTUM * r / (1.0 - r)


def gpu_queue_sigma(rho: np.ndarray) -> np.ndarray:
    r = np.clip(rho, 0.0, RHO_CAP)
    return GPU_QUANTUM * np.sqrt(r) / (1.0 - r)


def pcie_delay(util: np.ndarray) -> np.ndarray:
    u = np.clip(util, 0.0, RHO_CAP)
    return PAYLOAD / PCIE_BANDWIDTH / (1.0 - u)

