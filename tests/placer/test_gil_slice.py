"""The refresher's GIL slice changes the switch interval only while a refresh runs, and
gives back exactly what the process had, also when refreshes overlap."""

from __future__ import annotations

import sys
import threading

import pytest

from policyc.placer import Refresher, SimulatedCluster
from policyc.placer.gil_slice import GilSlice


@pytest.fixture
def interval():
    saved = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    yield 0.004
    sys.setswitchinterval(saved)


def test_a_slice_lowers_the_interval_inside_and_restores_it_after(interval: float) -> None:
    with GilSlice(0.0005):
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == pytest.approx(interval)


def test_overlapping_slices_keep_the_shortest_and_restore_once(interval: float) -> None:
    outer, inner = GilSlice(0.001), GilSlice(0.002)
    with outer:
        with inner:  # a longer slice entered later does not lengthen the one in force
            assert sys.getswitchinterval() == pytest.approx(0.001)
        assert sys.getswitchinterval() == pytest.approx(0.001)
    assert sys.getswitchinterval() == pytest.approx(interval)
    with pytest.raises(ValueError):
        GilSlice(0.0)


def test_a_slice_longer_than_the_process_interval_does_not_lengthen_it(interval: float) -> None:
    with GilSlice(0.05):
        assert sys.getswitchinterval() == pytest.approx(interval)


def test_the_refresher_slices_its_refreshes_and_records_their_spans(interval: float) -> None:
    seen: list[float] = []
    sim = SimulatedCluster(3, 4, 2, hosts_per_rack=4)
    sample = sim.sample

    def spy():
        seen.append(sys.getswitchinterval())
        return sample()

    sim.sample = spy  # type: ignore[method-assign]
    r = Refresher(sim, gil_slice=0.0005)
    threads = [threading.Thread(target=r.tick) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [pytest.approx(0.0005)] * 3
    assert sys.getswitchinterval() == pytest.approx(interval)
    spans = r.spans()
    assert len(spans) == 3 and all(a <= b for a, b in spans)
    assert [b - a for a, b in spans] == pytest.approx(list(r.latencies()))
    plain = Refresher(SimulatedCluster(3, 4, 2, hosts_per_rack=4))
    plain.tick()
    assert sys.getswitchinterval() == pytest.approx(interval)
