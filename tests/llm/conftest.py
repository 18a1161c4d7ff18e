"""The LLM tests' shared servers: `vllm_servers`, two real vLLM instances started once per
test session (see `vllm_fleet.py`). Tests that use it live under tests/llm/ so that every
one of them shares the same two instances."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from vllm_fleet import Launch, VllmFleet


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
