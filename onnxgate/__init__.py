"""The ONNX gate: contracts embedded in models, and FLOPs counted from the graph.

Public API (other stages call these, nothing else):

- `load_contract(model_bytes_or_path) -> Contract`, raising `ContractMetadataError`
  (`.field` names the missing or bad field) — used by `RegisterInstance`.
- `embed_contract(model, contract) -> ModelProto`.
- `count_flops(model, tokens, *, batch=1, dims=None) -> FlopCount`, raising `CountError`.
- `validate_model(source, *, tolerance=0.15, run=False, dims=None) -> ValidationReport`.
"""

from __future__ import annotations

from .contract_metadata import CONTRACT_KEY, HASH_KEY, embed_contract, load_contract
from .count import Convention, FlopCount, NodeCount, count_flops
from .errors import ContractMetadataError, CountError, GateError, ModelFileError

__all__ = [
    "CONTRACT_KEY",
    "HASH_KEY",
    "ContractMetadataError",
    "Convention",
    "CountError",
    "FlopCount",
    "GateError",
    "ModelFileError",
    "NodeCount",
    "count_flops",
    "embed_contract",
    "load_contract",
]
