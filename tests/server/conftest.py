"""A real decision server on a loopback ephemeral port, shared by the module's tests, and
the bundles and fleets they register."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import grpc
import pytest

from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb_grpc

REPO = Path(__file__).resolve().parents[2]
SMALL = ClusterSpec(seed=1, hosts=32, gpus_per_host=4, hosts_per_rack=4)


@pytest.fixture(scope="session")
def bundle() -> Bundle:
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    return r.bundle


def start(bundle: Bundle, cfg: ServeConfig, *, fleet_without: tuple[str, ...] = ("clinical-notes",)) -> ServerThread:
    server = DecisionServer(bundle, cfg)
    assert server.cluster is not None
    models = [c.name for c in bundle.contracts if c.name not in fleet_without]
    server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots(), models=models))
    th = ServerThread(server)
    th.start()
    return th


@pytest.fixture(scope="module")
def served(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    audit = tmp_path_factory.mktemp("audit") / "audit.db"
    th = start(bundle, ServeConfig(cluster=SMALL, audit_log=audit, start_refresher=False))
    yield th
    th.stop()


@pytest.fixture(scope="module")
def channel(served: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{served.server.port}") as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> pb_grpc.DecisionsStub:
    return pb_grpc.DecisionsStub(channel)
