"""A real pool for the model-server tests, started once per module: two KServe processes
on loopback, real ONNX models carrying their contracts.

- `primary`: stall control on; three instances, each on its own gRPC port:
  `fraud-scorer@host-01/gpu0` and `fraud-scorer@host-01/gpu2` (two replicas of
  fraud-scorer, full) and `fraud-scorer-lite@host-01/gpu1`.
- `backup`: stall control off; `fraud-scorer-lite@host-02/gpu0` with its simplified
  variant, also answering model `fraud-scorer` (the primary's retries).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from policy_text import REPO
from policyc.compiler.pipeline import compile_paths
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
from policyc.modelserver.model_files import ModelFiles, write_model_files

PRIMARY = "fraud-scorer@host-01/gpu0"
PRIMARY_LITE = "fraud-scorer-lite@host-01/gpu1"
REPLICA = "fraud-scorer@host-01/gpu2"
BACKUP = "fraud-scorer-lite@host-02/gpu0"

__all__ = ["BACKUP", "PRIMARY", "PRIMARY_LITE", "REPLICA", "model_files", "pool"]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelFiles]:
    bundle = compile_paths([str(REPO / "policies")]).bundle
    assert bundle is not None
    d: Path = tmp_path_factory.mktemp("models")
    full, lite = bundle.contract("fraud-scorer"), bundle.contract("fraud-scorer-lite")
    assert full is not None and lite is not None
    return {"fraud-scorer": write_model_files(full, d), "fraud-scorer-lite": write_model_files(lite, d, simplified=True)}


@pytest.fixture(scope="module")
def pool(model_files: dict[str, ModelFiles], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelPool]:
    full, lite = model_files["fraud-scorer"], model_files["fraud-scorer-lite"]
    p = ModelPool([
        ServerSpec((InstanceSpec(PRIMARY, full.full), InstanceSpec(PRIMARY_LITE, lite.full), InstanceSpec(REPLICA, full.full)),
                   stall_control=True),
        ServerSpec((InstanceSpec(BACKUP, lite.full, lite.simplified, name="fraud-scorer-lite",
                                 aliases=("fraud-scorer",)),)),
    ], workdir=tmp_path_factory.mktemp("pool"))
    p.start(timeout=60)
    try:
        yield p
    finally:
        p.stop()
