"""Fixtures for the server tests; helpers live in `server_support.py` (a unique module name,
since every test area has a conftest)."""

from server_support import *  # noqa: F401,F403
