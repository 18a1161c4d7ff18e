"""The refresher records when each refresh ran, so a benchmark can tell which requests
overlapped one."""

from __future__ import annotations

import time

import pytest

from policyc.placer import Refresher, SimulatedCluster


def test_each_refresh_leaves_its_span_and_its_latency_is_the_span() -> None:
    r = Refresher(SimulatedCluster(3, 4, 2, hosts_per_rack=4), history=2)
    before = time.perf_counter()
    for _ in range(3):
        r.tick()
    spans = r.spans()
    assert len(spans) == 2  # the history bounds both
    assert before <= spans[0][0] <= spans[0][1] <= spans[1][0] <= spans[1][1] <= time.perf_counter()
    assert [b - a for a, b in spans] == pytest.approx(list(r.latencies()))
