"""Real software TPMs (one `swtpm` per simulated host, each on its own ports), one real
etcd member, and policyc replicas on it, shared by the agent tests of a session (each test
takes its own key prefix)."""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from policyc.cluster.config import FleetConfig  # noqa: E402
from policyc.cluster.local_etcd import LocalEtcd  # noqa: E402
from policyc.cluster.local_tpm import SoftwareTpm  # noqa: E402
from policyc.cluster.tpm import HostTpm  # noqa: E402
from policyc.compiler.bundle import Bundle  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.server.app import DecisionServer, ServerThread  # noqa: E402
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL = ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4)  # host-0002: TPM, admits fraud-scorer
TPMS = ("a", "b", "c", "d")
_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
def bundle() -> Bundle:
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    return r.bundle


@pytest.fixture(scope="session")
def etcd() -> Iterator[LocalEtcd]:
    cluster = LocalEtcd.start(1)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def tpms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, HostTpm]]:
    """Four software TPMs, each with its agent state dir (its attestation key made once)."""
    root = tmp_path_factory.mktemp("tpms")
    started: list[SoftwareTpm] = []
    try:
        out = {}
        for name in TPMS:
            sw = SoftwareTpm.start(root)
            started.append(sw)
            out[name] = HostTpm(sw.tcti, root / f"agent-{name}")
            out[name].attestation_key()
        yield out
    finally:
        for sw in started:
            sw.stop()


def new_prefix() -> str:
    return f"/policyc-agent-test-{time.monotonic_ns()}-{next(_prefixes)}/"


def replica(bundle: Bundle, etcd: LocalEtcd, name: str, prefix: str, **fleet: object) -> ServerThread:
    cfg = FleetConfig(etcd=tuple(etcd.endpoints), name=name, prefix=prefix, lease_ttl=2, report_interval=0.3, **fleet)  # type: ignore[arg-type]
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE, watch_gpus=False,
                                                         fleet=cfg, open_fleet=True)))
    th.start()
    return th


def eventually(cond: Callable[[], bool], timeout: float, step: float = 0.02) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout:g} s")
        time.sleep(step)
    return time.monotonic() - t0
