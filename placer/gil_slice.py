"""Short GIL slices while a refresh runs, so a decision in flight waits less behind it.

The refresher shares the interpreter with the decision service's request threads. Most
of a refresh is numpy and scipy code that lets go of the GIL, but its Python stretches
(the simulator's step, snapshot assembly, table bookkeeping) keep it until the
interpreter's switch interval (5 ms by default) forces a hand-over. A request that
arrives then waits for up to that long before it runs at all, which is the whole of a
sub-millisecond placement's p99 budget.

`GilSlice(seconds)` is a context manager the refresher enters around each refresh: while
any refresh is inside it, the process's switch interval is `seconds` (e.g. 0.5 ms), so a
waiting request thread gets the GIL within about that long; the previous interval comes
back when the last refresh leaves. Outside refreshes nothing changes, so request threads
among themselves keep the interval the process chose. The interval is process-wide state
(`sys.setswitchinterval`): entries are counted under a lock so that overlapping refreshes
(several refreshers in one process) restore it once, in the right order.
"""

from __future__ import annotations

import sys
import threading


class GilSlice:
    """`with GilSlice(0.0005): ...` runs the block with the switch interval at 0.5 ms."""

    _lock = threading.Lock()
    _depth = 0
    _saved = 0.0

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"GIL slice must be a positive number of seconds, got {seconds!r}")
        self.seconds = float(seconds)

    def __enter__(self) -> "GilSlice":
        cls = type(self)
        with cls._lock:
            if cls._depth == 0:
                cls._saved = sys.getswitchinterval()
            cls._depth += 1
            sys.setswitchinterval(min(self.seconds, sys.getswitchinterval()))
        return self

    def __exit__(self, *exc: object) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                sys.setswitchinterval(cls._saved)


__all__ = ["GilSlice"]
