"""Scripted cluster events, as data: what happens, to what, for how long.

Events are queued and take effect on the simulator's next tick, like a real change that a
collector only sees when it next samples. `ticks=None` means until cleared.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class EventKind(str, Enum):
    WATERMARK = "watermark"  # a port's (or switch's) buffer occupancy pinned
    SM_COLLAPSE = "sm_collapse"  # a GPU's SM utilisation falls while its work piles up
    LINK_DOWN = "link_down"
    LINK_UP = "link_up"
    SERVICE_P99 = "service_p99"  # an endpoint's p99 latency pinned (seconds)
    GPU_HEALTH = "gpu_health"  # hardware health pinned (ECC / XID errors)
    OCCUPY = "occupy"  # extra demand on a GPU (work the placer dispatched)
    CLEAR = "clear"  # remove every pinned value on the target


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    target: str  # "host/port", "host/gpuN", switch name, endpoint name, "a|b" for a fabric link
    value: float = 0.0
    ticks: int | None = None

    def describe(self) -> str:
        span = "until cleared" if self.ticks is None else f"for {self.ticks} tick(s)"
        return f"{self.kind.value} {self.target} = {self.value:g} {span}"
