"""Fixtures for the placer tests; helpers live in `placer_support.py` (a unique module name,
since every test area has a conftest)."""

from placer_support import *  # noqa: F401,F403
