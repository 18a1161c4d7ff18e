"""Per-decision counters kept as plain Python numbers, exposed to Prometheus at scrape time.

`prometheus_client`'s Counter and Histogram take a lock and walk label dictionaries on
every call: five histogram observations and a counter cost a decision ~10 µs alone and ~30
µs on a busy server thread (measured), paid on the event loop that serves every call.
Five bisects per decision cost ~4 µs there. So a decision only counts its (outcome, reason)
in a dict and appends its total and stage times to one `array('d')` (five values a
decision, one call) under one uncontended lock (no object per decision is kept: queued
`Decision`s lived until the fold, were promoted by the collector's young passes and made
them more frequent and longer). Every `FOLD_AT` decisions, and when Prometheus scrapes,
the queue is folded into the buckets with numpy.
A collector turns them into the same metric families (`policyc_decisions_total`,
`policyc_decision_seconds_bucket/_sum/_count`, `policyc_decision_stage_seconds_…{stage}`).
The total has a family of its own: beside its parts under one `stage` label, a sum over
`stage` would count every decision twice.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left
from typing import Iterator, Sequence

import numpy as np
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .decision import Decision, Outcome, Stage

STAGES = ("parse", "feasibility", "match", "place")  # `Timing.stages()` order
LATENCY_BUCKETS = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25, 1.0)
_BOUNDS = np.array(LATENCY_BUCKETS)
_WIDTH = 1 + len(STAGES)  # values queued per decision: the total, then the stages
FOLD_AT = 256  # queued observations folded at once on the observing thread (~0.1 ms of work, never a long stall)


# enum values read once (an Enum's `.value` is a property: a Python call per read)
_VALUE: dict[Outcome | Stage, str] = {**{o: o.value for o in Outcome}, **{x: x.value for x in Stage}}
_OK = {o: (o.value, "ok") for o in Outcome}


class _Histogram:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0

    def add(self, v: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
        self.total += v

    def add_many(self, values: Sequence[float] | np.ndarray) -> None:
        """`add` for each value (bucket `le` inclusive, as `bisect_left` gives)."""
        v = np.asarray(values, dtype=np.float64)
        if not v.size:
            return
        for i, n in enumerate(np.bincount(np.searchsorted(_BOUNDS, v, side="left"), minlength=len(self.counts)).tolist()):
            self.counts[i] += n
        self.total += float(v.sum())

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, n in zip((*(repr(b) for b in LATENCY_BUCKETS), "+Inf"), self.counts):
            running += n
            out.append((bound, float(running)))
        return out


class DecisionCounters(Collector):
    """Decisions by (outcome, reason), decision latency (the total) and its parts by stage
    (the four stages; a stage that took no time, e.g. placement of a request the solver rejected, is
    not observed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_reason: dict[tuple[str, str], int] = {}
        self._total = _Histogram()
        self._stages = tuple(_Histogram() for _ in STAGES)
        # per decision not folded yet, its total then its stages' times (one array, five values each)
        self._queued = array("d")

    def observe(self, d: Decision) -> None:
        rej = d.rejection
        key = _OK[d.outcome] if rej is None else (_VALUE[d.outcome], rej.binding or _VALUE[rej.stage])
        t = d.timing
        with self._lock:
            self._by_reason[key] = self._by_reason.get(key, 0) + 1
            q = self._queued
            q.extend((t.total, t.parse, t.feasibility, t.match, t.place))
            if len(q) >= _WIDTH * FOLD_AT:
                self._fold_locked(q)

    def _fold(self) -> None:
        with self._lock:
            self._fold_locked(self._queued)

    def _fold_locked(self, q: array) -> None:  # type: ignore[type-arg]
        """The queued times into the histograms (the lock held)."""
        if not q:
            return
        self._queued = array("d")
        rows = np.frombuffer(q, dtype=np.float64).reshape(-1, _WIDTH)
        self._total.add_many(rows[:, 0])
        for j, h in enumerate(self._stages, 1):
            v = rows[:, j]
            h.add_many(v[v != 0])  # a stage that took no time is not observed

    def count(self, outcome: str, reason: str) -> int:
        """How many decisions had this outcome and reason ("ok" for admissions)."""
        return self._by_reason.get((outcome, reason), 0)

    def totals(self) -> dict[tuple[str, str], int]:
        """Every (outcome, reason) counted so far and its count."""
        with self._lock:
            return dict(self._by_reason)

    def collect(self) -> Iterator[Metric]:
        self._fold()
        with self._lock:
            reasons = dict(self._by_reason)
            total = (self._total.cumulative(), self._total.total)
            hists = [(name, h.cumulative(), h.total) for name, h in zip(STAGES, self._stages) if any(h.counts)]
        c = CounterMetricFamily("policyc_decisions", "Decisions by outcome and reason", labels=["outcome", "reason"])
        for (outcome, reason), n in sorted(reasons.items()):
            c.add_metric([outcome, reason], n)
        yield c
        t = HistogramMetricFamily("policyc_decision_seconds", "Decision latency inside the server, end to end")
        t.add_metric([], *total)
        yield t
        h = HistogramMetricFamily("policyc_decision_stage_seconds", "Decision latency inside the server by stage "
                                  "(parts of policyc_decision_seconds)", labels=["stage"])
        for stage, buckets, seconds in hists:
            h.add_metric([stage], buckets, seconds)
        yield h
