"""Fixtures for the cluster tests; helpers live in `cluster_rig.py` (a unique module name,
since every test area has a conftest)."""

from cluster_rig import *  # noqa: F401,F403
