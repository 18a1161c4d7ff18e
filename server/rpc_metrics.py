"""Per-RPC counts and latency, and the enforcer's series, exposed to Prometheus at scrape time.

Kept as plain numbers, as `decision_counters.py` does for decisions: a call counts its
(method, code) in a dict and appends its seconds to its method's `array('d')` under one
uncontended lock (no object kept per call), folded into the buckets every `FOLD_AT` calls
and at every scrape, not prometheus_client's per-call label walk.
Decide and DecideBatch count themselves (`counts_itself`): no wrapper coroutine on the hot path. Families: `policyc_rpc_requests_total{method, code}` and
`policyc_rpc_seconds{method}` (server-side, from the handler's start to its answer);
`policyc_enforcer_actions_total{kind, outcome}`, `policyc_enforcer_quarantines_total` and
`policyc_enforcer_active_streams` and `policyc_enforcer_programs_attached` from the guardian,
its plane and its action sink.
"""

from __future__ import annotations

import functools
import threading
import time
from array import array
from typing import Any, Awaitable, Callable, Iterator, Mapping, TypeVar

import grpc
import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .decision_counters import FOLD_AT, _Histogram

F = TypeVar("F", bound=Callable[..., Any])


class RpcCounters(Collector):
    """Calls by (method, status code) and their latency by method."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[tuple[str, str], int] = {}
        self._latency: dict[str, _Histogram] = {}
        self._queued: dict[str, array] = {}  # type: ignore[type-arg]  # method -> seconds not folded yet

    def observe(self, method: str, code: str, seconds: float) -> None:
        key = (method, code)
        with self._lock:
            self._calls[key] = self._calls.get(key, 0) + 1
            q = self._queued.get(method)
            if q is None:
                q = self._queued[method] = array("d")
            q.append(seconds)
            if len(q) >= FOLD_AT:
                self._fold_locked(method, q)

    def _fold_locked(self, method: str, q: array) -> None:  # type: ignore[type-arg]
        self._queued[method] = array("d")
        h = self._latency.get(method)
        if h is None:
            h = self._latency[method] = _Histogram()
        h.add_many(np.frombuffer(q, dtype=np.float64))

    def _fold(self) -> None:
        with self._lock:
            for method, q in list(self._queued.items()):
                if q:
                    self._fold_locked(method, q)

    def count(self, method: str, code: str) -> int:
        return self._calls.get((method, code), 0)

    def collect(self) -> Iterator[Metric]:
        self._fold()
        with self._lock:
            calls = dict(self._calls)
            hists = [(m, h.cumulative(), h.total) for m, h in sorted(self._latency.items())]
        c = CounterMetricFamily("policyc_rpc_requests", "RPCs answered, by method and status code", labels=["method", "code"])
        for (method, code), n in sorted(calls.items()):
            c.add_metric([method, code], n)
        yield c
        h = HistogramMetricFamily("policyc_rpc_seconds", "RPC latency inside the server, by method", labels=["method"])
        for method, buckets, total in hists:
            h.add_metric([method], buckets, total)
        yield h


Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def _timed(name: str, fn: Handler, counters: RpcCounters) -> Handler:
    @functools.wraps(fn)
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        t0 = time.perf_counter()
        try:
            out = await fn(request, context)
        except BaseException:
            counters.observe(name, code_name(context, "UNKNOWN"), time.perf_counter() - t0)
            raise
        counters.observe(name, code_name(context, "OK"), time.perf_counter() - t0)
        return out

    return call


def counts_itself(fn: F) -> F:
    """Mark a handler that observes its own calls in `RpcCounters` (as `_timed` would:
    method, status code name, seconds from its start), so `timed_handlers` adds no wrapper."""
    fn.counts_itself = True  # type: ignore[attr-defined]
    return fn


def code_name(context: grpc.aio.ServicerContext, default: str) -> str:
    """The status code a handler's call ended with, by name (`default` when none was set)."""
    return getattr(context.code(), "name", None) or default


def timed_handlers(handlers: Mapping[str, grpc.RpcMethodHandler], counters: RpcCounters) -> dict[str, grpc.RpcMethodHandler]:
    """The same unary handlers, each counting its calls and timing them (those marked
    `counts_itself` do that themselves)."""
    out = {}
    for name, h in handlers.items():
        if getattr(h.unary_unary, "counts_itself", False):
            out[name] = h
            continue
        out[name] = grpc.unary_unary_rpc_method_handler(_timed(name, h.unary_unary, counters),
                                                        request_deserializer=h.request_deserializer,
                                                        response_serializer=h.response_serializer)
    return out


class EnforcerSeries(Collector):
    """What the guardian exposes: its actions by kind and outcome (read from the action
    sink's append-only record list, from where the last scrape stopped), quarantines, and
    the streams it is timing now."""

    def __init__(self, records: list[Any], active_streams: Callable[[], int], attached_programs: Callable[[], int]) -> None:
        self._records = records
        self._active = active_streams
        self._attached = attached_programs
        self._seen = 0
        self._actions: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            new = self._records[self._seen:]
            self._seen += len(new)
            for r in new:
                key = (r.kind.value, r.outcome.value)
                self._actions[key] = self._actions.get(key, 0) + 1
            actions = dict(self._actions)
        c = CounterMetricFamily("policyc_enforcer_actions", "Enforcer actions, by kind and outcome", labels=["kind", "outcome"])
        for (kind, outcome), n in sorted(actions.items()):
            c.add_metric([kind, outcome], n)
        yield c
        q = CounterMetricFamily("policyc_enforcer_quarantines", "Backends quarantined by the enforcer")
        q.add_metric([], sum(n for (kind, outcome), n in actions.items() if kind == "quarantine" and outcome == "done"))
        yield q
        g = GaugeMetricFamily("policyc_enforcer_active_streams", "Requests whose budget the guardian is timing now")
        g.add_metric([], self._active())
        yield g
        p = GaugeMetricFamily("policyc_enforcer_programs_attached", "BPF programs attached by the kernel plane (0 in user space)")
        p.add_metric([], self._attached())
        yield p
