"""The queue-depth signal fed by real scrapes: model servers' `/metrics` (vLLM's names,
served over HTTP on loopback) read by the metrics scraper, handed to the placer through
`measured.by_endpoint` and `WithReadings`, steer placement on the next tick; a server that
stops answering leaves its reading to age, and the plan says it fell back."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from placer_support import contract, instances

from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.measured import WithReadings, by_endpoint, endpoint_gpus
from policyc.placer.metrics_scraper import MetricsScraper

PAGE = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 1.0
"""


class _Server:
    """A loopback `/metrics` page whose waiting count the test sets."""

    def __init__(self) -> None:
        self.waiting = 0.0
        self.silent = False  # answer nothing: close each connection unanswered
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                if outer.silent:
                    self.close_connection = True
                    return
                body = PAGE.format(waiting=outer.waiting).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def servers():  # type: ignore[no-untyped-def]
    out = [_Server(), _Server()]
    yield out
    for s in out:
        s.close()


def _until(cond, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_scraped_queues_steer_placement_and_a_silent_server_falls_back(servers) -> None:  # type: ignore[no-untyped-def]
    sim = SimulatedCluster(seed=7, hosts=4, gpus_per_host=4, hosts_per_rack=2)
    insts = instances(sim)[:2]
    insts = [i.model_copy(update={"deployment": i.deployment.model_copy(update={"endpoint": s.endpoint})})
             for i, s in zip(insts, servers)]
    gpu = endpoint_gpus(insts)
    with MetricsScraper(interval_s=0.05) as scraper:
        for s in servers:
            scraper.add(s.endpoint, "vllm")
        r = Refresher(WithReadings(sim, by_endpoint(scraper.snapshot, lambda: gpu)))
        placer = Placer(r)

        def place_after(waiting: tuple[float, float]) -> PlacementPlan:
            for s, w in zip(servers, waiting):
                s.waiting = w

            def seen() -> bool:
                got = [scraper.snapshot(s.endpoint) for s in servers]
                return all(g is not None and g.values.get("queue_depth") == w and g.age_s < 0.2
                           for g, w in zip(got, waiting))
            _until(seen, f"the scraper to read {waiting}")
            r.tick()
            plan = placer.place(insts, 0.2, contract(), affinity_key=f"k{waiting}")
            assert isinstance(plan, PlacementPlan), plan
            return plan

        first = place_after((40.0, 0.0))
        assert first.gpu_key == gpu[servers[1].endpoint]
        second = place_after((0.0, 40.0))
        assert second.gpu_key == gpu[servers[0].endpoint]

        servers[0].silent = True  # server A stops answering: its last reading ages
        _until(lambda: (g := scraper.snapshot(servers[0].endpoint)) is not None and g.age_s > 0.5, "A's reading to age")
        r.tick()
        plan = placer.place(insts[:1], 0.2, contract(), affinity_key="a-only")
        assert isinstance(plan, PlacementPlan)
        notes = [x for x in plan.reasons if "queue depth" in x]
        assert notes and "stale" in notes[0] and "the modelled queue stands" in notes[0], plan.reasons


def test_a_server_without_the_narrowed_page_is_scraped_whole() -> None:
    """A `vllm` endpoint whose `/metrics/` is a 404 (another server, an older build): the scraper
    asks for the narrowed page once, then for the whole one, and says which it reads."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            asked.append(self.path)
            body = PAGE.format(waiting=2.0).encode() if self.path == "/metrics" else b"not found"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    endpoint = f"127.0.0.1:{http.server_address[1]}"
    try:
        with MetricsScraper(interval_s=0.05) as scraper:
            scraper.add(endpoint, "vllm")
            _until(lambda: (r := scraper.snapshot(endpoint)) is not None and r.values.get("queue_depth") == 2.0, "a reading")
            _until(lambda: len(asked) >= 4, "more scrapes")
            r = scraper.snapshot(endpoint)
            assert r is not None and r.source == f"vllm http://{endpoint}/metrics" and r.error is None
            assert asked[0].startswith("/metrics/?name[]=vllm%3Acache_config_info&") and "name[]=vllm%3Anum_requests_waiting&" in asked[0] and set(asked[1:]) == {"/metrics"}
            assert scraper.stats().failures == 0
    finally:
        http.shutdown()
        http.server_close()
