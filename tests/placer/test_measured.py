"""Measured readings reach the placer's snapshot with their ages, from a source keyed by
GPU or by endpoint (the metrics scraper's shape), on their own clock between two samples of
the telemetry."""

from __future__ import annotations

import numpy as np
from placer_support import instances

from policyc.placer import Refresher, SimulatedCluster
from policyc.placer.measured import WithReadings, by_endpoint, endpoint_gpus
from policyc.placer.paths import path_table
from policyc.placer.readings import Reading
from policyc.placer.snapshot import build_snapshot


def test_each_tick_carries_the_readings_taken_as_it_was_sampled() -> None:
    sim = SimulatedCluster(seed=7, hosts=2, gpus_per_host=2, hosts_per_rack=2)
    key = sim.topology().gpu_key(0)
    current = {key: Reading({"queue_depth": 3.0}, 0.02)}
    r = Refresher(WithReadings(sim, lambda: current))
    r.tick()
    first = r.current().frame.measured
    assert first == {key: Reading({"queue_depth": 3.0}, 0.02)}
    current[key] = Reading({"queue_depth": 9.0}, 0.01)
    assert r.current().frame.measured[key].values["queue_depth"] == 3.0  # a tick's readings are that tick's
    r.tick()
    assert r.current().frame.measured[key] == Reading({"queue_depth": 9.0}, 0.01)
    assert r.source.topology() is sim.topology()


def test_readings_by_endpoint_land_on_the_endpoints_gpus() -> None:
    sim = SimulatedCluster(seed=7, hosts=2, gpus_per_host=2, hosts_per_rack=2)
    insts = [i.model_copy(update={"deployment": i.deployment.model_copy(update={"endpoint": f"10.0.0.{n}:8000"})})
             for n, i in enumerate(instances(sim))]
    insts.append(instances(sim)[0])  # no endpoint: placement only, no reading
    gpus = endpoint_gpus(insts)
    assert len(gpus) == 4 and gpus["10.0.0.1:8000"] == f"{insts[1].deployment.host}/{insts[1].deployment.gpu}"
    scraped = {"10.0.0.1:8000": Reading({"queue_depth": 4.0}, 0.05), "10.0.0.2:8000": None}
    got = by_endpoint(lambda e: scraped.get(e), lambda: gpus)()
    assert got == {gpus["10.0.0.1:8000"]: Reading({"queue_depth": 4.0}, 0.05)}


class _Counted:
    """A telemetry source that counts its samples."""

    def __init__(self, source: SimulatedCluster) -> None:
        self.name, self.source, self.samples = source.name, source, 0

    def topology(self):  # type: ignore[no-untyped-def]
        return self.source.topology()

    def sample(self):  # type: ignore[no-untyped-def]
        self.samples += 1
        return self.source.sample()


def test_readings_are_taken_again_on_their_own_clock_between_samples() -> None:
    """With `measured_interval`, the readings reach a new snapshot every measured tick while
    the telemetry (and the fabric search on it) is sampled every `interval`; a measured
    snapshot shares the telemetry's arrays and age and rebuilds only its tables."""
    sim = SimulatedCluster(seed=7, hosts=2, gpus_per_host=2, hosts_per_rack=2)
    key = sim.topology().gpu_key(0)
    current = {key: Reading({"queue_depth": 1.0}, 0.01)}
    now = [100.0]
    src = _Counted(sim)
    r = Refresher(WithReadings(src, lambda: current), 0.2, measured_interval=0.05, clock=lambda: now[0])
    assert r.cadence == 0.05
    first = r.tick()
    assert src.samples == 1
    first_wait = path_table(first, first.thresholds, None).wait
    seen = [first]
    for step, depth in enumerate((8.0, 20.0, 40.0)):  # 50, 100 and 150 ms after the sample: measured ticks
        now[0] += 0.05
        current[key] = Reading({"queue_depth": depth}, 0.01)
        snap = r.tick(None)
        assert src.samples == 1, f"measured tick {step} sampled the telemetry"
        assert snap.version == seen[-1].version + 1 and r.current() is snap
        assert snap.frame.measured[key].values["queue_depth"] == depth
        assert snap.fabric_dist is first.fabric_dist and snap.scores is first.scores and snap.taken_at == first.taken_at
        assert snap.tables is not seen[-1].tables
        seen.append(snap)
    # the measured snapshot's tables are what a full build on the same frame gives, to the bit
    last = seen[-1]
    reference = build_snapshot(last.version, last.topology, last.frame, None, None, last.thresholds, 0.2, last.taken_at)
    got, want = path_table(last, last.thresholds, None), path_table(reference, reference.thresholds, None)
    assert np.array_equal(got.wait, want.wait) and np.array_equal(got.code, want.code)
    assert not np.array_equal(got.wait, first_wait), "the deeper queue changed nothing: the test would prove nothing"
    now[0] += 0.05  # 200 ms after the sample: the telemetry is due
    full = r.tick(None)
    assert src.samples == 2 and full.fabric_dist is not first.fabric_dist and full.taken_at == now[0]


def test_without_a_measured_interval_every_tick_samples() -> None:
    sim = SimulatedCluster(seed=7, hosts=2, gpus_per_host=2, hosts_per_rack=2)
    src = _Counted(sim)
    r = Refresher(WithReadings(src, dict), 0.2)
    assert r.cadence == 0.2
    for _ in range(3):
        r.tick(None)
    assert src.samples == 3
    slower = Refresher(WithReadings(_Counted(sim), dict), 0.2, measured_interval=0.5)  # the readings' clock is not the faster
    assert slower.cadence == 0.2
    bare = Refresher(_Counted(sim), 0.2, measured_interval=0.05)  # no readings to take on their own
    assert bare.cadence == 0.2


def test_with_no_readings_at_all_a_measured_tick_makes_no_snapshot() -> None:
    sim = SimulatedCluster(seed=7, hosts=2, gpus_per_host=2, hosts_per_rack=2)
    now = [10.0]
    r = Refresher(WithReadings(sim, dict), 0.2, measured_interval=0.05, clock=lambda: now[0])
    first = r.tick()
    now[0] += 0.05
    assert r.tick(None) is first and r.current() is first  # nothing measured: the tables stand


def test_servers_sharing_a_gpu_make_one_reading_summed_and_fullest() -> None:
    """Copies of a model on one GPU, each its own engine: the GPU's reading sums their
    requests and counters, takes the fullest cache and the oldest age (the rule of several
    engines on one server's page, `server_metric_names.COMBINE`)."""
    gpus = {"10.0.0.1:8000": "h0/gpu0", "10.0.0.2:8000": "h0/gpu0", "10.0.0.3:8000": "h0/gpu1"}
    scraped = {
        "10.0.0.1:8000": Reading({"queue_depth": 3.0, "running": 2.0, "kv_cache_usage": 0.25, "ttft_count": 10.0,
                                  "block_size": 16.0}, 0.02, 0.05),
        "10.0.0.2:8000": Reading({"queue_depth": 0.0, "running": 1.0, "kv_cache_usage": 0.75, "ttft_count": 4.0,
                                  "block_size": 16.0}, 0.09, 0.05),
        "10.0.0.3:8000": Reading({"queue_depth": 5.0}, 0.01, 0.05),
    }
    got = by_endpoint(lambda e: scraped.get(e), lambda: gpus)()
    assert got["h0/gpu0"] == Reading({"queue_depth": 3.0, "running": 3.0, "kv_cache_usage": 0.75, "ttft_count": 14.0,
                                      "block_size": 16.0}, 0.09, 0.05)
    assert got["h0/gpu1"] == scraped["10.0.0.3:8000"]  # alone on its GPU: its own reading
    # a copy with no reading yet leaves the other's as the GPU's (a key one server lacks: the others')
    scraped["10.0.0.2:8000"] = None  # type: ignore[assignment]
    assert by_endpoint(lambda e: scraped.get(e), lambda: gpus)()["h0/gpu0"] == scraped["10.0.0.1:8000"]
