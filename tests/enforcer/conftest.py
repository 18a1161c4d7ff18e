"""Fixtures for the enforcer tests; helpers live in `enforcer_support.py` (a unique module name,
since every test area has a conftest)."""

from enforcer_support import *  # noqa: F401,F403
