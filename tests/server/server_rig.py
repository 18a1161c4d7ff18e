"""Helpers for the server tests: start a real decision server with a registered fleet
(a uniquely named module, so it never collides with other areas' `conftest`)."""

from __future__ import annotations

from pathlib import Path


from policyc.compiler.bundle import Bundle
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, ServeConfig
from policyc.server.fleet import admissible_fleet

REPO = Path(__file__).resolve().parents[2]
SMALL = ClusterSpec(seed=1, hosts=32, gpus_per_host=4, hosts_per_rack=4)


def start(bundle: Bundle, cfg: ServeConfig, *, fleet_without: tuple[str, ...] = ("clinical-notes",)) -> ServerThread:
    server = DecisionServer(bundle, cfg)
    assert server.cluster is not None
    models = [c.name for c in bundle.contracts if c.name not in fleet_without]
    server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots(), models=models))
    th = ServerThread(server)
    th.start()
    return th


