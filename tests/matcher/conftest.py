"""Fixtures for the matcher tests; helpers live in `matcher_support.py` (a unique module name,
since every test area has a conftest)."""

from matcher_support import *  # noqa: F401,F403
