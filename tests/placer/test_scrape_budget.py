"""The metrics scraper's fleet-wide budget: the per-endpoint tick is stretched from its
configured interval when the fleet is large (scrapes a second over every endpoint, and the
scraper's own CPU a scrape, measured), the tick in use travels with every reading, and the
staleness bounds follow it, so the budget never makes a reading stale by itself."""

from __future__ import annotations

import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from placer_support import contract, instances

from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.measured import WithReadings, by_endpoint
from policyc.placer.metrics_scraper import MAX_TICK_S, MetricsScraper
from policyc.placer.readings import STALE_TICKS, Reading, age_limit, fresh

PAGE = b"""# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
"""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def pages():  # type: ignore[no-untyped-def]
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Handler) for _ in range(12)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def test_the_tick_follows_the_fleet_size_and_the_measured_cost() -> None:
    s = MetricsScraper(0.05)  # not started: the budget's arithmetic alone
    assert s.tick_for(8, math.nan) == (0.05, "interval")  # a small fleet keeps the configured tick
    assert s.tick_for(32, math.nan) == (pytest.approx(0.16), "scrapes/s")  # 200 scrapes a second over the fleet
    assert s.tick_for(100, math.nan) == (pytest.approx(0.5), "scrapes/s")
    assert s.tick_for(32, 2e-3) == (pytest.approx(32 * 2e-3 / 0.25), "cpu")  # a dear scrape: the CPU bound is the larger
    assert s.tick_for(100_000, math.nan) == (MAX_TICK_S, "scrapes/s")  # never slower than the cap
    unbounded = MetricsScraper(0.05, max_scrapes_per_s=math.inf, cpu_budget=math.inf)
    assert unbounded.tick_for(1000, 1e-3) == (0.05, "interval")  # the budget off: every endpoint each interval
    with pytest.raises(ValueError, match="max_scrapes_per_s"):
        MetricsScraper(0.05, max_scrapes_per_s=0)


def test_staleness_bounds_follow_the_tick_in_use() -> None:
    assert age_limit(0.25, 0.0) == 0.25 and age_limit(0.25, 0.16) == pytest.approx(STALE_TICKS * 0.16)
    assert fresh(Reading({}, 0.6, 0.16), 0.25) and not fresh(Reading({}, 0.6), 0.25)
    assert not fresh(Reading({}, 0.9, 0.16), 0.25)  # five stretched ticks missed: stale all the same
    # the tick travels from an endpoint's reading to its GPU's (measured.by_endpoint)
    got = by_endpoint(lambda e: Reading({"queue_depth": 1.0}, 0.5, 0.16), lambda: {"10.0.0.1:8000": "h/gpu0"})()
    assert got == {"h/gpu0": Reading({"queue_depth": 1.0}, 0.5, 0.16)}

    # on the placer's path: the same 0.6 s old queue reading is used at a 160 ms tick and
    # reported stale (falling back to the model) when its source claims no stretched tick
    sim = SimulatedCluster(seed=7, hosts=4, gpus_per_host=4, hosts_per_rack=2)
    inst = instances(sim)[0]
    key = f"{inst.deployment.host}/{inst.deployment.gpu}"
    for tick, stale in ((0.16, False), (0.0, True)):
        r = Refresher(WithReadings(sim, lambda t=tick: {key: Reading({"queue_depth": 3.0, "running": 1.0}, 0.6, t)}))
        r.tick()
        plan = Placer(r).place([inst], 0.2, contract(), affinity_key=f"t{tick}")
        assert isinstance(plan, PlacementPlan), plan
        notes = [x for x in plan.reasons if "queue depth" in x]
        assert notes and ("stale" in notes[0]) is stale, plan.reasons
        assert ("3 waiting, measured 600 ms ago on a 160 ms tick" in notes[0]) is not stale, plan.reasons


def test_a_large_fleet_is_scraped_on_the_stretched_tick_and_never_stale_for_it(pages) -> None:  # type: ignore[no-untyped-def]
    # 12 endpoints within 40 scrapes a second: each one every 300 ms, longer than the signals'
    # own 250 ms bound, so only the tick-following bound keeps the readings usable
    with MetricsScraper(0.05, max_scrapes_per_s=40.0) as scraper:
        for e in pages:
            scraper.add(e, "vllm")
        assert scraper.tick_s == pytest.approx(0.3) and scraper.stale_after_s() == pytest.approx(1.5)
        end = time.monotonic() + 60
        while any((r := scraper.snapshot(e)) is None or not r.values for e in pages):  # every endpoint read once
            assert time.monotonic() < end, [scraper.snapshot(e) for e in pages]
            time.sleep(0.05)
        a = scraper.stats()
        ages, flagged = [], 0
        for _ in range(30):
            time.sleep(0.1)
            for e in pages:
                r = scraper.snapshot(e)
                assert r is not None and r.tick_s == pytest.approx(0.3)
                ages.append(r.age_s)
                flagged += r.stale
                got = scraper.reading(e)
                assert got is not None and got.tick_s == pytest.approx(0.3) and got.values["queue_depth"] == 2.0
        b = scraper.stats()
    assert b.budget == "scrapes/s" and b.tick_s == pytest.approx(0.3)
    # at most the budget's rate (a loaded machine only scrapes less); 20 % for the window's edges
    assert (b.scrapes - a.scrapes) / (b.wall_s - a.wall_s) <= 40.0 * 1.2
    # the stretched tick shows in the ages (a 50 ms tick would keep them near 0.05 s) ...
    assert max(ages) > 0.25
    # ... and is not taken for staleness: stale needs five missed 300 ms ticks, which only a
    # starved scraper shows; a bound fixed at 250 ms would have flagged every age above it
    assert flagged <= 0.05 * len(ages), (flagged, len(ages), sorted(ages)[-5:])
    # measured: the scraper priced its own scrapes (CPU seconds of its thread a scrape)
    assert 0 < b.cpu_per_scrape_s < 0.05, b


def test_the_budget_is_a_flag_of_serve_and_gateway_with_the_scrapers_default() -> None:
    import argparse

    from policyc.cli.scrape_flags import DEFAULT_BUDGET, add_scrape_flags, scrape_budget
    from policyc.placer.metrics_scraper import DEFAULT_MAX_SCRAPES_PER_S
    from policyc.server.config import ServeConfig

    assert DEFAULT_BUDGET == DEFAULT_MAX_SCRAPES_PER_S == ServeConfig().metrics_scrape_budget
    p = argparse.ArgumentParser(exit_on_error=False)
    add_scrape_flags(p)
    assert scrape_budget(p.parse_args([])) == DEFAULT_BUDGET
    assert scrape_budget(p.parse_args(["--scrape-budget", "640"])) == 640.0
    for bad in ("0", "nan", "lots"):
        with pytest.raises(argparse.ArgumentError, match="scrapes"):
            p.parse_args(["--scrape-budget", bad])
