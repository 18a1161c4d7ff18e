"""A real 3-member etcd cluster on loopback per test module, and policyc replicas on it
(in-process `ServerThread`s; each test takes its own key prefix, so tests share the etcd
cluster without sharing state)."""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from policyc.client import operator_channel
from policyc.cluster.config import FleetConfig  # noqa: E402
from policyc.cluster.local_etcd import LocalEtcd  # noqa: E402
from policyc.compiler.bundle import Bundle  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.server.app import DecisionServer, ServerThread  # noqa: E402
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig  # noqa: E402
from policyc.server.proto import pb_grpc  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL = ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4)
TTL = 2  # seconds: replica and instance leases in these tests
_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
def bundle() -> Bundle:
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    return r.bundle


@pytest.fixture(scope="module")
def etcd() -> Iterator[LocalEtcd]:
    cluster = LocalEtcd.start(3)
    yield cluster
    cluster.stop()


def new_prefix() -> str:
    return f"/policyc-test-{time.monotonic_ns()}-{next(_prefixes)}/"


def replica(bundle: Bundle, etcd: LocalEtcd, name: str, prefix: str, **cfg: object) -> ServerThread:
    fleet = FleetConfig(etcd=tuple(etcd.endpoints), name=name, prefix=prefix, lease_ttl=TTL, report_interval=0.3)
    # open_fleet: these tests are about replication; the operator token is tested in tests/server
    base: dict[str, object] = {"cluster": SMALL, "enforcer": EnforcerMode.USERSPACE, "watch_gpus": False, "fleet": fleet,
                               "open_fleet": True}
    base.update(cfg)
    th = ServerThread(DecisionServer(bundle, ServeConfig(**base)))  # type: ignore[arg-type]
    th.start()
    return th


@pytest.fixture
def replicas(bundle: Bundle, etcd: LocalEtcd) -> Iterator[list[ServerThread]]:
    prefix = new_prefix()
    started = [replica(bundle, etcd, f"r{i}", prefix) for i in range(3)]
    yield started
    for th in started:
        th.stop()


def stub(th: ServerThread) -> tuple[grpc.Channel, pb_grpc.DecisionsStub]:
    ch = operator_channel(f"127.0.0.1:{th.server.port}")
    return ch, pb_grpc.DecisionsStub(ch)


def eventually(cond: Callable[[], bool], timeout: float, step: float = 0.01) -> float:
    """Seconds until `cond()` held; fails the test after `timeout`."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout:g} s")
        time.sleep(step)
    return time.monotonic() - t0
