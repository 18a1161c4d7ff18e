"""Measured readings reach the placer's snapshot with their ages, from a source keyed by
GPU or by endpoint (the metrics scraper's shape)."""

from __future__ import annotations

from placer_support import instances

from policyc.placer import Refresher, SimulatedCluster
from policyc.placer.measured import WithReadings, by_endpoint, endpoint_gpus
from policyc.placer.readings import Reading


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
