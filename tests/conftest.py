"""Fixtures shared by every test area. Shared helper code lives in uniquely named modules
(`policy_text.py`), never imported from a `conftest`, since each area has its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy_text import REPO


@pytest.fixture
def repo() -> Path:
    return REPO
