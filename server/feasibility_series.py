"""The solver's work as metrics: where each Z3 call ran, and how many requests waited for one.

`policyc_feasibility_solves_total{where=...}` counts Z3 calls by where they ran: `loop` (a
thread running the serving event loop: the decision path promises this stays at 0),
`inline` (a caller's own thread: `check` off the loop, a reload's `warm`) and `background`
(the solver thread filling shapes the serving path queued). `policyc_feasibility_pending_total`
counts serving-path look-ups that found their shape not solved yet. Totals are summed over
every policy state served (a reload's new state starts at 0 and the old one's count is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from policyc.solver.feasibility import RequestFeasibility


class FeasibilitySeries(Collector):
    def __init__(self, current: Callable[[], RequestFeasibility]) -> None:
        self._current = current
        self._retired = {"loop": 0, "inline": 0, "background": 0, "pending": 0}
        self._last: RequestFeasibility | None = None

    def counts(self) -> dict[str, int]:
        f = self._current()
        if self._last is not None and f is not self._last:  # a reload: keep the old state's totals
            for k, v in self._of(self._last).items():
                self._retired[k] += v
        self._last = f
        now = self._of(f)
        return {k: self._retired[k] + now[k] for k in now}

    @staticmethod
    def _of(f: RequestFeasibility) -> dict[str, int]:
        return {"loop": f.solves_on_loop, "inline": f.solves_inline - f.solves_on_loop,
                "background": f.solves_background, "pending": f.pending}

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        c = self.counts()
        solves = CounterMetricFamily("policyc_feasibility_solves", "Z3 feasibility calls, by where they ran", labels=["where"])
        for where in ("loop", "inline", "background"):
            solves.add_metric([where], c[where])
        yield solves
        pending = CounterMetricFamily("policyc_feasibility_pending", "Serving-path look-ups whose shape was not solved yet")
        pending.add_metric([], c["pending"])
        yield pending
        cached = GaugeMetricFamily("policyc_feasibility_shapes", "Reduced feasibility shapes solved and cached")
        cached.add_metric([], len(self._current().seen()))
        yield cached
