"""Fixtures: the compiled example bundle and one real gateway (Envoy, the picker next to
the decision service, KServe model servers) shared by a module's tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gateway_rig import Gateway, start_gateway  # noqa: E402

from policyc.compiler.bundle import Bundle  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.modelserver.client import OipClient  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def bundle() -> Bundle:
    """The example policies, `slow-placement` at 2000 % of the predicted time (tests/rig_policies.py says why)."""
    from rig_policies import rig_policies

    r = compile_paths([str(rig_policies())], analyse=False)
    assert r.ok and r.bundle is not None
    return r.bundle


@pytest.fixture(scope="module")
def gateway(bundle: Bundle) -> Iterator[Gateway]:
    gw = start_gateway(bundle)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def client(gateway: Gateway) -> Iterator[OipClient]:
    with OipClient(gateway.listen) as c:
        yield c
