"""The project's tiny LLM, made locally: `policyc llm make-model` is deterministic for a seed,
writes what vLLM loads (weights, a byte-level BPE with the chat specials, a ChatML template)
and a contract that compiles with its `llm` block counted from the shape; without vLLM's
venv the LLM tests fail naming the fix (never skip)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from policyc.compiler.pipeline import compile_paths
from vllm_fleet import Launch

POLICYC = [sys.executable, "-m", "policyc.cli.main"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*POLICYC, "llm", "make-model", str(out), *extra], capture_output=True, text=True, timeout=600)


def test_make_model_is_deterministic_and_complete(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    # the three builds at once (each is mostly its interpreter importing torch): one build's time, not three
    builds = [subprocess.Popen([*POLICYC, "llm", "make-model", str(out), "--seed", seed], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for out, seed in ((a, "0"), (b, "0"), (c, "1"))]
    for p in builds:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    assert "918,144 parameters" in out
    for name in ("model.safetensors", "tokenizer.json", "config.json", "policyc.contract"):
        assert digest(a / name) == digest(b / name), name
    assert digest(a / "model.safetensors") != digest(c / "model.safetensors")  # the seed is the weights'
    assert digest(a / "tokenizer.json") == digest(c / "tokenizer.json")

    config = json.loads((a / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (4096, 128, 2, 2)
    assert config["tie_word_embeddings"] is True and config["dtype"] == "bfloat16"
    tok = Tokenizer.from_file(str(a / "tokenizer.json"))
    assert tok.get_vocab_size() == 4096
    specials = [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    assert None not in specials and config["eos_token_id"] == specials[2]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids[0] == specials[1]  # one token, not its letters
    assert "<|im_start|>" in (a / "chat_template.jinja").read_text()

    result = compile_paths([a / "policyc.contract"], analyse=False)
    assert result.bundle is not None, result.diagnostics
    contract = result.bundle.contracts[0]
    facts = json.loads((a / "build.json").read_text())
    assert contract.name == "tiny-llama" and contract.compute.flops.lo == facts["flops_per_token"]
    assert contract.llm is not None and contract.llm.context == 1024 and contract.llm.kv_bytes_per_token == 512
    assert contract.llm.prefill_flops == contract.llm.decode_flops == facts["flops_per_token"]


def test_make_model_usage_errors(tmp_path):
    r = make(tmp_path / "x", "--name", "Tiny Llama")
    assert r.returncode == 2 and "--name" in r.stderr
    (tmp_path / "file").write_text("")
    r = make(tmp_path / "file")
    assert r.returncode == 2 and "not a folder" in r.stderr


def test_without_vllms_venv_the_fixture_fails_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYC_VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match="scripts/setup.sh"):
        Launch(tmp_path).start()
    r = make(tmp_path / "m")
    assert r.returncode == 2 and "scripts/setup.sh" in r.stderr
