"""Fixtures for the agent tests; helpers live in `agent_rig.py` (a unique module name,
since every test area has a conftest)."""

from agent_rig import *  # noqa: F401,F403
