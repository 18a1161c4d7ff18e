"""Fixtures for the onnxgate tests; helpers live in `onnxgate_support.py` (a unique module name,
since every test area has a conftest)."""

from onnxgate_support import *  # noqa: F401,F403
