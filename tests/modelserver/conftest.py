"""Fixtures for the model-server tests; helpers live in `modelserver_support.py` (a unique
module name, since every test area has a conftest)."""

from modelserver_support import *  # noqa: F401,F403
