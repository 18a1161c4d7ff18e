"""The event loop the decision service runs on: uvloop where it is installed, asyncio's own
otherwise (or when `POLICYC_EVENT_LOOP=asyncio` asks for it).

grpc.aio drives each call through a handful of loop callbacks and futures; uvloop's C
loop does that bookkeeping for less CPU on the one thread that also makes every decision
(measured on a no-op grpc.aio service here: ~370 -> ~315 µs of loop-thread CPU per call).
"""

from __future__ import annotations

import asyncio
import enum
import os
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
ENV = "POLICYC_EVENT_LOOP"


class LoopKind(str, enum.Enum):
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def loop_kind() -> LoopKind:
    """uvloop unless the environment asks for asyncio or uvloop is not installed."""
    asked = os.environ.get(ENV, LoopKind.UVLOOP.value).strip().lower()
    if asked not in (k.value for k in LoopKind):
        raise ValueError(f"{ENV}={asked!r}: expected one of {', '.join(k.value for k in LoopKind)}")
    if asked == LoopKind.ASYNCIO.value:
        return LoopKind.ASYNCIO
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return LoopKind.ASYNCIO
    return LoopKind.UVLOOP


def new_event_loop() -> asyncio.AbstractEventLoop:
    if loop_kind() is LoopKind.UVLOOP:
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the service's event loop (for `policyc serve`)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
