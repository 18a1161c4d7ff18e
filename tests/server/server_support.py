"""Fixtures: the compiled example bundle and a real decision server on a loopback
ephemeral port, shared by a module's tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_rig import REPO, SMALL, start  # noqa: E402

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.server.app import ServerThread  # noqa: E402
from policyc.server.config import ServeConfig  # noqa: E402
from policyc.server.proto import pb_grpc  # noqa: E402


@pytest.fixture(scope="session")
def bundle() -> Bundle:
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    return r.bundle


@pytest.fixture(scope="module")
def served(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    audit = tmp_path_factory.mktemp("audit") / "audit.db"
    th = start(bundle, ServeConfig(cluster=SMALL, audit_log=audit, start_refresher=False))
    yield th
    th.stop()


@pytest.fixture(scope="module")
def channel(served: ServerThread) -> Iterator[grpc.Channel]:
    with operator_channel(f"127.0.0.1:{served.server.port}") as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> pb_grpc.DecisionsStub:
    return pb_grpc.DecisionsStub(channel)
