"""Where the picker's CPU goes, measured on the serving loop's own thread in the real path.

`benchmarks/gateway.py --parts` wraps four calls of the live picker (on their instances, so
grpc, Envoy and the decision service run unchanged): the whole pick
(`EndpointPicker._request_headers`), the decision service's part of it
(`DecisionService.decide_shape`), and within that the placer's `Placer.place` and the audit
record's encode and hand-off (`AuditBridge.record`); the pick less the decision service is
the gateway's own request path (header view, shape key, plan, answer bytes, in-flight count). Each wrapper adds the calling thread's
CPU time (`time.thread_time`) spent inside the call to its total. Unlike cProfile's shares
(whose per-call overhead inflates many-small-call code about twice), these are the thread's
own CPU seconds. The wrappers cost something: `time.thread_time` is a system call here
(~0.45 us in a hot loop) and a wrapped call reads ~1.5-3 us more in the real path (a call of
0.09 us in a hot loop read 3.2 us wrapped), so an outer figure holds its inner wrappers' cost
(the pick ~6-10 us of them) and the process's CPU per request the same: compare `--parts`
runs with `--parts` runs. With the serving loop's thread and the picker process, the rest is the ext_proc
hop (grpc's per-stream work) and the process's other threads.
"""

from __future__ import annotations

import functools
import gc
import threading
import time
from typing import Any, Callable


class Part:
    """One wrapped call: CPU seconds on the calling thread inside it, and how many calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cpu_s = 0.0
        self.calls = 0

    def wrap_sync(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                self.cpu_s += time.thread_time() - c0
                self.calls += 1
        return timed

    def wrap_async(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A coroutine function whose hot path never awaits (the pick: it awaits only for a new
        shape's feasibility or a sync-mode audit record: a pick that awaits also counts what
        other coroutines ran meanwhile, a few picks of a run, its first of each shape)."""
        @functools.wraps(fn)
        async def timed(*a: Any, **k: Any) -> Any:
            c0 = time.thread_time()
            try:
                return await fn(*a, **k)
            finally:
                self.cpu_s += time.thread_time() - c0
                self.calls += 1
        return timed


class Collections:
    """The garbage collector's passes (`gc.callbacks`): thread CPU in them, by generation,
    whichever thread's allocation triggered them (the pick's parts above count those that
    ran inside them too)."""

    def __init__(self) -> None:
        self.cpu_s = [0.0, 0.0, 0.0]
        self.passes = [0, 0, 0]
        self._started: dict[int, float] = {}
        gc.callbacks.append(self._hook)

    def close(self) -> None:
        """Stop counting (the hook out of `gc.callbacks`)."""
        if self._hook in gc.callbacks:
            gc.callbacks.remove(self._hook)

    def _hook(self, phase: str, info: dict[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.thread_time()
            return
        t0 = self._started.pop(me, None)
        if t0 is not None:
            g = info.get("generation", 0)
            self.cpu_s[g] += time.thread_time() - t0
            self.passes[g] += 1


class PickParts:
    """The four parts of one picker, installed on its instances."""

    def __init__(self, picker: Any, placer: Any | None, audit: Any | None) -> None:
        self.pick, self.place, self.audit = Part("pick"), Part("place"), Part("audit record")
        self.decide = Part("decision service")
        picker._request_headers = self.pick.wrap_async(picker._request_headers)
        picker.service.decide_shape = self.decide.wrap_sync(picker.service.decide_shape)
        self.gc = Collections()
        if placer is not None:
            placer.place = self.place.wrap_sync(placer.place)
        if audit is not None:
            audit.record = self.audit.wrap_sync(audit.record)

    def snapshot(self) -> tuple[float, ...]:
        """(pick, place, audit record, decision service) CPU seconds, the picks so far, then
        the collector's CPU seconds and passes by generation."""
        return (self.pick.cpu_s, self.place.cpu_s, self.audit.cpu_s, self.decide.cpu_s, self.pick.calls,
                *self.gc.cpu_s, *self.gc.passes)

    @staticmethod
    def line(before: tuple[float, ...], after: tuple[float, ...], requests: int,
             loop_s: float, process_s: float, writer_s: float, noop_loop_s: float, noop_process_s: float,
             noop_requests: int) -> str:
        """The parts per request between two snapshots, against the no-op ext_proc server's
        loop and process in the same rounds."""
        n = max(int(after[4] - before[4]), 1)
        pick, place, audit, decide = ((after[i] - before[i]) / n * 1e6 for i in range(4))
        gc_us = [(after[i] - before[i]) / n * 1e6 for i in (5, 6, 7)]
        passes = [int(after[i] - before[i]) for i in (8, 9, 10)]
        r, nr = max(requests, 1), max(noop_requests, 1)
        loop, proc, writer = loop_s / r * 1e6, process_s / r * 1e6, writer_s / r * 1e6
        noop_loop, noop_proc = noop_loop_s / nr * 1e6, noop_process_s / nr * 1e6
        return (f"thread CPU per pick (serving loop, {n} picks): the pick {pick:.0f} us: the gateway's own request path "
                f"{pick - decide:.0f} us, the decision service {decide:.0f} us (the placer's place {place:.0f} us, the audit "
                f"record's encode and hand-off {audit:.0f} us, the rest {decide - place - audit:.0f} us); the serving loop's thread {loop:.0f} us a request (no-op {noop_loop:.0f}), "
                f"so outside the pick {loop - pick:.0f} us (the ext_proc hop, refresher steps); the picker process but the "
                f"writer {proc - writer:.0f} us (no-op {noop_proc:.0f}), its other threads {proc - writer - loop:.0f} us; "
                f"the audit writer {writer:.0f} us; garbage collection in this process {sum(gc_us):.1f} us a pick "
                f"(generations 0/1/2: {gc_us[0]:.1f} / {gc_us[1]:.1f} / {gc_us[2]:.1f} us, {passes[0]} / {passes[1]} / "
                f"{passes[2]} passes; counted within the parts where it ran)")
