"""The LLM tests' shared servers: `vllm_servers`, two real vLLM instances started once per
test session (see `vllm_fleet.py`). Tests that use it live under tests/llm/ so that every
one of them shares the same two instances; each such test's time limit is raised to
`VLLM_TEST_TIMEOUT_S`, since the first one also waits for the servers to start (about a
minute each on a quiet machine, in parallel; several on a loaded one)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from vllm_fleet import START_TIMEOUT_S, Launch, VllmFleet

VLLM_TEST_TIMEOUT_S = START_TIMEOUT_S + 300


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm_servers" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(VLLM_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def vllm_servers() -> Iterator[VllmFleet]:
    """Two vLLM OpenAI servers on the tiny model, each bound to its own core; a failure
    (not a skip) when vLLM's venv is missing or a server does not come up."""
    workdir = Path(tempfile.mkdtemp(prefix="policyc-llm-tests-"))
    launch = Launch(workdir, count=2)
    try:
        fleet = launch.start()
    except RuntimeError as e:
        launch.stop()
        pytest.fail(str(e), pytrace=False)
    try:
        yield fleet
    finally:
        launch.stop()
