"""The scraper follows the registry: it scrapes the registered instances that carry a
`metrics` label (their server kind) and drops the ones that leave; its snapshots feed the
placer's measured readings per GPU (`placer.measured.by_endpoint`) with their ages. Run
against emulated vLLM servers (same routes and metrics), so no vLLM start is needed."""

from __future__ import annotations

import time

from policyc.matcher.instance import Deployment, Instance
from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec
from policyc.placer.measured import by_endpoint, endpoint_gpus
from policyc.placer.metrics_scraper import MetricsScraper


def instance(i: int, endpoint: str, labels: dict[str, str]) -> Instance:
    return Instance(id=f"m@host-{i}/gpu0", model="m", labels=labels,
                    deployment=Deployment(host=f"host-{i}", gpu="gpu0", gpu_model="A100-80G", region="us-west", endpoint=endpoint))


def test_follow_the_registry_and_feed_the_placer():
    with EmulatorServer([EmulatorSpec("m"), EmulatorSpec("m"), EmulatorSpec("m")]) as srv, \
            MetricsScraper(interval_s=0.05) as scraper:
        a, b, c = srv.endpoints
        fleet = [instance(0, a, {"metrics": "vllm"}), instance(1, b, {"metrics": "vllm"}),
                 instance(2, c, {})]  # no metrics label: an ONNX server, not scraped
        scraper.follow(fleet)
        assert scraper.endpoints == sorted([a, b])
        readings = by_endpoint(scraper.snapshot, lambda: endpoint_gpus(fleet))
        deadline = time.monotonic() + 10
        got = readings()
        while time.monotonic() < deadline and not all(r.values for r in got.values()):
            time.sleep(0.02)
            got = readings()
        assert set(got) == {"host-0/gpu0", "host-1/gpu0"}
        for r in got.values():
            assert r.values["queue_depth"] == 0 and r.values["block_size"] == 128
            assert 0 <= r.age_s < 1.0
        scraper.follow(fleet[1:])  # host-0's instance deregistered
        assert scraper.endpoints == [b]
        assert scraper.snapshot(a) is None
        scraper.follow([instance(1, b, {"metrics": "sglang"})])  # its kind changed: scraped with SGLang's names
        time.sleep(0.3)
        r = scraper.snapshot(b)
        assert r is not None and r.source.startswith("sglang ") and "queue_depth" not in r.values
