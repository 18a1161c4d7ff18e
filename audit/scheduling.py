"""The audit path's background work is scheduled as batch work (Linux SCHED_BATCH).

The audit writer process and the threads that feed it (the log's sender and acknowledgement
readers, the server bridge's flush timer) each wake ~20-40 times a second for work that can
wait a few milliseconds. Under the normal policy each wake-up may preempt whatever runs on
its CPU: on the gateway that is Envoy, a model server or the decision service in the middle
of a call, and on this project's 2-vCPU machine (two hyperthreads of one core) every such
preemption costs the preempted process more CPU per call than the woken work itself
(measured on the gateway benchmark, audited rig at 16 callers, batch vs normal in 10
alternating pairs of 1 s rounds: the writer process batch 0.91x the rig's CPU per call and
1.17x the calls/s; the three threads batch too, on top of it, 0.92x and 1.08x). SCHED_BATCH
keeps the same fair share of the CPU (so the log keeps up at any load, unlike a lower nice
value), only its wake-ups no longer preempt: woken work waits at most a scheduler slice (a
few ms) for a busy CPU, well inside the group-commit interval (50 ms) and the bridge's window.
"""

from __future__ import annotations

import os


def run_as_batch() -> bool:
    """Put the calling thread (the whole process, when it has one thread) under SCHED_BATCH.
    False where the policy is not available: the work runs the same, scheduled as usual."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # Linux: 0 is the calling thread
    except (AttributeError, OSError):
        return False
    return True
