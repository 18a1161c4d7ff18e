"""Real-time scheduling and CPU pinning for the collector thread, when permitted.

The published figure (192 ms per 200 ms tick, 400 ms+ before isolation) came from
isolating the collector; here a refresh costs milliseconds, but a collector that shares
two cores with request handlers still gets preempted. SCHED_FIFO and an affinity mask
help where the process may set them (root or CAP_SYS_NICE); elsewhere we say why not and
carry on at normal priority.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RealtimeOutcome:
    fifo: bool
    pinned: tuple[int, ...]
    notes: tuple[str, ...]


def apply_realtime(priority: int | None, cpus: tuple[int, ...] | None) -> RealtimeOutcome:
    """Apply to the calling thread (Linux applies both per thread for pid 0)."""
    notes: list[str] = []
    fifo = False
    pinned: tuple[int, ...] = ()
    if priority is not None:
        try:
            lo, hi = os.sched_get_priority_min(os.SCHED_FIFO), os.sched_get_priority_max(os.SCHED_FIFO)
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(max(lo, min(hi, priority))))
            fifo = True
        except (PermissionError, OSError, AttributeError) as e:
            notes.append(f"SCHED_FIFO not applied ({e.__class__.__name__}: {e}); collector runs at normal priority")
    if cpus:
        try:
            allowed = os.sched_getaffinity(0)
            want = set(cpus) & allowed
            if not want:
                notes.append(f"CPU pinning not applied: none of {sorted(cpus)} is in this process's allowed set {sorted(allowed)}")
            else:
                os.sched_setaffinity(0, want)
                pinned = tuple(sorted(want))
        except (PermissionError, OSError, AttributeError) as e:
            notes.append(f"CPU pinning not applied ({e.__class__.__name__}: {e})")
    return RealtimeOutcome(fifo, pinned, tuple(notes))
