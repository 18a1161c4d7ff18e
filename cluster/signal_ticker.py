"""The agent's collection loop: one thread that samples its host every `period` seconds
(absolute deadlines, so a late tick does not push the next ones) and hands each report to
`publish` (the agent's etcd writer, which keeps only the latest). It measures itself: the
period it actually kept and its jitter (standard deviation of the intervals between tick
starts, and the worst lateness) over the last ticks, and the CPU seconds one tick of
collection costs (this thread's `thread_time`), all carried in every report.

The seed's isolation knobs are flags: `sched_fifo` (a SCHED_FIFO priority) and `cpus` (the
CPUs it may run on), applied to the agent's threads (see `_isolate`). Either that cannot be applied (no privilege, a CPU
that is not there) raises `IsolationError` at start, naming it: an agent asked to be
isolated never runs silently unisolated.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from typing import Any, Callable

from .host_signals import Collector

log = logging.getLogger("policyc.agent")
WINDOW = 50  # ticks the period and jitter are measured over


class IsolationError(RuntimeError):
    pass


def parse_cpus(text: str) -> tuple[int, ...]:
    """`0,2-3` -> (0, 2, 3); ValueError naming the bad part."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a or b - a > 4096:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"--cpus `{text}`: `{part}` is not a CPU number or range (e.g. 0,2-3)") from None
    if not out or min(out) < 0:
        raise ValueError(f"--cpus `{text}`: no CPUs")
    return tuple(sorted(set(out)))


class Ticker:
    def __init__(self, collector: Collector, period: float, publish: Callable[[dict[str, Any]], None], *,
                 sched_fifo: int | None = None, cpus: tuple[int, ...] | None = None) -> None:
        if not 0.01 <= period <= 60:
            raise ValueError(f"signal period {period!r} s: between 0.01 and 60 s")
        if sched_fifo is not None and not 1 <= sched_fifo <= 99:
            raise ValueError(f"--sched-fifo {sched_fifo}: a SCHED_FIFO priority is 1..99")
        self.collector, self.period, self.publish = collector, period, publish
        self.sched_fifo, self.cpus = sched_fifo, cpus
        self.intervals: deque[float] = deque(maxlen=WINDOW)
        self.lateness: deque[float] = deque(maxlen=WINDOW)
        self.tick_cpu: deque[float] = deque(maxlen=WINDOW)
        self.ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="policyc-agent-signals", daemon=True)
        self._thread.start()
        if not self._ready.wait(60):  # a loaded machine's thread start; never an agent that runs unisolated unsaid
            raise IsolationError("the signal collector's thread did not start within 60 s")
        if self._failed is not None:
            raise self._failed

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.collector.close()

    def _isolate(self) -> None:
        """Every thread of the process, not the collector's alone: the collector needs the
        interpreter lock, and a thread holding it while preempted by the load would stall a
        SCHED_FIFO collector all the same (seen: a 229 ms late tick with only the collector
        isolated). Threads started later inherit it from their creator."""
        if self.cpus is None and self.sched_fifo is None:
            return
        try:
            tids = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            tids = [0]
        try:
            for tid in tids:
                try:
                    if self.cpus is not None:
                        os.sched_setaffinity(tid, self.cpus)
                    if self.sched_fifo is not None:
                        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(self.sched_fifo))
                except ProcessLookupError:  # a thread that ended meanwhile
                    continue
        except (OSError, ValueError) as e:
            what = [f"--cpus {','.join(map(str, self.cpus))}"] if self.cpus is not None else []
            what += [f"--sched-fifo {self.sched_fifo}"] if self.sched_fifo is not None else []
            raise IsolationError(f"could not apply {' '.join(what)}: {e} (SCHED_FIFO needs root or CAP_SYS_NICE; CPUs must exist "
                                 f"and be allowed: {sorted(os.sched_getaffinity(0))})") from None

    def stats(self) -> dict[str, float]:
        """Its own collection: the period kept and its jitter, the worst lateness and the
        CPU per tick, over the last ticks (seconds)."""
        iv, late, cpu = list(self.intervals), list(self.lateness), list(self.tick_cpu)
        out = {"period_s": self.period, "ticks": float(self.ticks)}
        if iv:
            out["period_mean_s"] = statistics.fmean(iv)
            out["jitter_s"] = statistics.pstdev(iv) if len(iv) > 1 else 0.0
        if late:
            out["late_max_s"] = max(late)
        if cpu:
            out["cpu_per_tick_s"] = statistics.fmean(cpu)
        return out

    def _run(self) -> None:
        try:
            self._isolate()
        except IsolationError as e:
            self._failed = e
            self._ready.set()
            return
        self._ready.set()
        next_at = time.monotonic()
        last_start: float | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            if now < next_at:
                if self._stop.wait(next_at - now):
                    break
                now = time.monotonic()
            self.lateness.append(now - next_at)
            if last_start is not None:
                self.intervals.append(now - last_start)
            last_start = now
            c0 = time.thread_time()
            try:
                body = self.collector.sample()
            except Exception as e:  # noqa: BLE001 - a reading that failed is reported, the loop goes on
                log.warning("agent signals: a sample failed: %s", e)
                body = {"error": str(e)[:200]}
            self.tick_cpu.append(time.thread_time() - c0)
            self.ticks += 1
            body["time"] = time.time()
            body["agent"] = self.stats()
            try:
                self.publish(body)
            except RuntimeError:  # the loop it publishes to has closed: stopping
                break
            next_at += self.period
            if next_at < time.monotonic() - self.period:  # fell more than a tick behind: skip, don't burst
                next_at = time.monotonic()


__all__ = ["IsolationError", "Ticker", "parse_cpus"]
