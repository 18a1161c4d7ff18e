"""Fixtures for the evidence tests; helpers live in `evidence_support.py` (a unique module
name, since every test area has a conftest)."""

from evidence_support import *  # noqa: F401,F403
