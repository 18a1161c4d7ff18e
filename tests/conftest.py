"""Fixtures shared by every test area. Shared helper code lives in uniquely named modules
(`policy_text.py`), never imported from a `conftest`, since each area has its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy_text import REPO


@pytest.fixture
def repo() -> Path:
    return REPO


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `single_threaded` run first: they need a process with no thread but the
    main one (the compiler's front end forks workers only then), and the first grpc.aio
    server or channel in the session starts a poller thread that lives until the end."""
    items.sort(key=lambda item: item.get_closest_marker("single_threaded") is None)
