"""The ONNX files a model server serves: real transformer graphs (onnxgate's reference
models, real random weights, they run in onnxruntime) carrying their contract in their
metadata, in two variants.

- `full`: what an instance serves to a first attempt.
- `simplified`: a smaller real model with the same input and output signature, so a
  backup can answer the very request body the gateway retries (an Envoy retry resends the
  original bytes) with less compute. The file says which variant it is under the metadata
  key `policyc.variant`.

The contract embedded is the instance's own (a `fraud-scorer-lite` backup's files carry
`fraud-scorer-lite`), so the server learns its model's name and promise from the file,
and the instance registers with that file (`RegisterInstance(onnx_model=…)`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from policyc.compiler.bundle import Contract
from policyc.onnxgate.contract_metadata import embed_contract
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer

from .wire import FULL, SIMPLIFIED, VARIANT_KEY

# Both variants read the same `input_ids[batch, sequence]` (ids below VOCAB, at most
# MAX_LEN of them) and answer `logits[batch, sequence, VOCAB]`.
VOCAB = 256
MAX_LEN = 64
SPECS: dict[str, TransformerSpec] = {
    FULL: TransformerSpec(vocab=VOCAB, d_model=64, heads=4, layers=2, d_ff=256, max_len=MAX_LEN),
    SIMPLIFIED: TransformerSpec(vocab=VOCAB, d_model=32, heads=2, layers=1, d_ff=64, max_len=MAX_LEN),
}


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """A contract's model files on disk: the full variant, and the simplified one if built."""

    model: str
    full: Path
    simplified: Path | None = None


def build_variant(contract: Contract, variant: str, *, seed: int = 0) -> onnx.ModelProto:
    """The `variant` model (`full` or `simplified`) carrying `contract` and its variant name."""
    spec = SPECS.get(variant)
    if spec is None:
        raise ValueError(f"unknown variant `{variant}` (known: {', '.join(SPECS)})")
    # The model takes the contract's token count (its FLOPs are counted there, by
    # `policyc validate` and at registration); requests stay within MAX_LEN.
    spec = replace(spec, max_len=max(spec.max_len, contract.compute.tokens))
    model = embed_contract(build_transformer(spec, seed=seed), contract)
    model.metadata_props.add(key=VARIANT_KEY, value=variant)
    return model


def write_model_files(contract: Contract, directory: Path, *, simplified: bool = False, seed: int = 0) -> ModelFiles:
    """Write `<contract>.full.onnx` (and `<contract>.simplified.onnx`) under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for variant in (FULL, SIMPLIFIED) if simplified else (FULL,):
        path = directory / f"{contract.name}.{variant}.onnx"
        onnx.save_model(build_variant(contract, variant, seed=seed), str(path))
        paths[variant] = path
    return ModelFiles(contract.name, paths[FULL], paths.get(SIMPLIFIED))


def variant_of(model: onnx.ModelProto) -> str:
    """The variant a model file declares (`full` when it declares none)."""
    for p in model.metadata_props:
        if p.key == VARIANT_KEY:
            return p.value
    return FULL
