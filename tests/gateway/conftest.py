"""Fixtures for the gateway tests; helpers live in `gateway_support.py` (a unique module name,
since every test area has a conftest)."""

from gateway_support import *  # noqa: F401,F403
