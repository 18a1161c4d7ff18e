"""The gate for LLM folders: the contract's per-token cost against the model's `config.json`.

- The project's tiny Llama shape (what `policyc llm make-model` writes) meets the contract
  `make-model` writes for it and `policies/llm/tiny-llm.contract`.
- A folder whose model grew by 50 % (a wider MLP) but kept its contract is drift, named per
  field with the deviation; `policyc modelserver --engine emulator` refuses to serve it
  (exit 1, the gate's message, no traceback) before starting anything.
- A config without a decoder's shape is refused naming the field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from policyc.compiler.pipeline import compile_paths
from policyc.modelserver.llm_model import contract_source
from policyc.onnxgate.llm_config_check import check_llm_config, read_shape

REPO = Path(__file__).resolve().parents[2]
TINY = {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
        "max_position_embeddings": 1024, "torch_dtype": "bfloat16", "architectures": ["LlamaForCausalLM"]}
GROWN = {**TINY, "intermediate_size": 981}  # 2 * (2 * (49152 + 384 * 981)) + 1048576 = 1.5 x the tiny model's


def _folder(d: Path, config: dict[str, object], contract_of: dict[str, object] | None = None) -> Path:
    """A model folder: config.json and the contract `make-model` writes for `contract_of`'s shape."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    shape = contract_of or config
    flops = read_shape(d).flops_per_token() if contract_of is None else _flops(d.parent / "shape-of", shape)
    facts = {"flops_per_token": flops, "context": 1024, "parameters": 0, "shape": shape}
    (d / "policyc.contract").write_text(contract_source("tiny-llama", facts))
    return d


def _flops(d: Path, config: dict[str, object]) -> int:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return read_shape(d).flops_per_token()


def _contract(path: Path, name: str = "tiny-llama"):  # type: ignore[no-untyped-def]
    r = compile_paths([path, REPO / "policies" / "gpu-catalog.contract"], analyse=False)
    assert r.ok and r.bundle is not None, r.diagnostics
    c = r.bundle.contract(name)
    assert c is not None
    return c


def test_tiny_model_meets_its_contracts(tmp_path: Path) -> None:
    d = _folder(tmp_path / "tiny", TINY)
    assert read_shape(d).flops_per_token() == 1_835_008  # 2 layers x 393,216 + 2 x 128 x 4,096
    v = check_llm_config(d, _contract(d / "policyc.contract"))
    assert v.ok and "contract `tiny-llama` holds: 1.835e+06 FLOPs per token" in v.message, v.message
    policy = _contract(REPO / "policies" / "llm" / "tiny-llm.contract", "tiny-llm")
    assert check_llm_config(d, policy).ok


def test_a_model_grown_50_percent_is_drift_naming_each_field(tmp_path: Path) -> None:
    d = _folder(tmp_path / "grown", GROWN, contract_of=TINY)  # the old contract kept
    v = check_llm_config(d, _contract(d / "policyc.contract"))
    assert not v.ok and v.counted == pytest.approx(1.5 * 1_835_008, rel=1e-3)
    assert "contract drift in `tiny-llama`" in v.message
    for field in ("compute.flops", "llm.prefill", "llm.decode"):
        assert f"`{field}` declares 1.835e+06 FLOPs per token (+50.0% outside the interval)" in v.message, v.message


def test_modelserver_refuses_to_serve_a_drifted_folder(tmp_path: Path) -> None:
    d = _folder(tmp_path / "grown", GROWN, contract_of=TINY)
    p = subprocess.run([sys.executable, "-m", "policyc.cli.main", "modelserver", "--engine", "emulator", "--model", str(d)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "contract drift in `tiny-llama`" in p.stderr and "+50.0% outside the interval" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("broken, field", [
    ({k: v for k, v in TINY.items() if k != "hidden_size"}, "hidden_size"),
    ({**TINY, "num_hidden_layers": "two"}, "num_hidden_layers"),
    ({**TINY, "vocab_size": -1}, "vocab_size"),
])
def test_config_without_a_decoder_shape_is_refused_naming_the_field(tmp_path: Path, broken: dict[str, object], field: str) -> None:
    ok = _folder(tmp_path / "ok", TINY)
    (ok / "config.json").write_text(json.dumps(broken))
    v = check_llm_config(ok, _contract(ok / "policyc.contract"))
    assert not v.ok and f"`{field}`" in v.message and "config.json" in v.message
    (ok / "config.json").write_text("[1, 2")
    v = check_llm_config(ok, _contract(ok / "policyc.contract"))
    assert not v.ok and "not JSON" in v.message


def test_the_folder_make_model_writes_meets_its_own_contract() -> None:
    """The real folder (`policyc llm make-model`, shared in vLLM's venv): its config.json, as
    transformers wrote it, against the contract written beside it and the policies' tiny-llm."""
    from policyc.modelserver.llm_model import cached_llm_model

    model = cached_llm_model()
    v = check_llm_config(model.dir, _contract(model.contract_path, model.name))
    assert v.ok and v.counted == model.facts["flops_per_token"], v.message
    assert check_llm_config(model.dir, _contract(REPO / "policies" / "llm" / "tiny-llm.contract", "tiny-llm")).ok
