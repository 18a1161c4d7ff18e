"""The placement signals, one file each, registered here by name in the order a
candidate's first failure is reported (`ORDER`: a refusal names the first constraint in
this order that a GPU fails). Adding a signal: write its file (see `framework.py` and
`queue_depth.py`, the smallest measured one) and add an instance to `SIGNALS`."""

from __future__ import annotations

from typing import Any

from ..framework import Signal, Stage
from ..plan import Constraint
from .dependency import Dependency
from .gateway_in_flight import GatewayInFlight
from .gpu_class import GpuClass
from .gpu_share import GpuShare
from .health import Health
from .kv_cache import KvCache
from .latency_budget import LatencyBudget
from .measured_ttft import MeasuredTtft
from .network import Network
from .pcie import Pcie
from .port import Port
from .port_backlog import PortBacklog
from .predicted_ttft import PredictedTtft
from .prefix_affinity import PrefixAffinity
from .queue_depth import QueueDepth
from .running_requests import RunningRequests
from .session_store import SessionStore

SIGNALS: tuple[Signal[Any], ...] = (
    GpuClass(), Health(), GpuShare(), Pcie(), SessionStore(), PortBacklog(), Port(), Network(), Dependency(), QueueDepth(), RunningRequests(), KvCache(),
    MeasuredTtft(),
    LatencyBudget(),
    GatewayInFlight(), PrefixAffinity(), PredictedTtft(),  # last: they never refuse (read at the pick, `pick.py`)
)

REGISTRY: dict[str, Signal[Any]] = {s.name: s for s in SIGNALS}
ORDER: tuple[Constraint, ...] = tuple(s.constraint for s in SIGNALS)
CODE: dict[Constraint, int] = {c: i for i, c in enumerate(ORDER)}
BY_CONSTRAINT: dict[Constraint, Signal[Any]] = {s.constraint: s for s in SIGNALS}
assert len(REGISTRY) == len(SIGNALS) and len(BY_CONSTRAINT) == len(SIGNALS), "a signal's name and word are its own"


def of_stage(stage: Stage) -> tuple[Signal[Any], ...]:
    """The registered signals of one stage, in `ORDER`."""
    return tuple(s for s in SIGNALS if s.stage is stage)


__all__ = ["BY_CONSTRAINT", "CODE", "ORDER", "REGISTRY", "SIGNALS", "of_stage"]
