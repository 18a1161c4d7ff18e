"""The gate for LLM folders: a contract's per-token cost checked against the model's config.

An LLM is served from a folder (`config.json`, weights, tokenizer) that vLLM loads; its
contract's `llm` block promises FLOPs per prompt token (prefill) and per output token
(decode), the KV-cache bytes a token holds and a context. A decoder's forward pass costs 2
FLOPs per weight multiplied per token, so the shape in `config.json` gives the cost without
loading a weight:

    per layer  2 * (h*H*d (q) + 2*h*K*d (k, v) + H*d*h (o) + 3*h*I (gate, up, down))
    per token  layers * per layer + 2*h*vocab (the output projection, tied or not)
    KV bytes   layers * 2 (K and V) * K * d * bytes of the dtype

(h hidden size, H attention heads, K key-value heads, d head size, I intermediate size;
the embedding lookup is a gather, not a multiply). Attention's score and value products
grow with the position and are not counted per token, as the contract's figure does not.

The check fails closed like `validate`: a config without the fields of a decoder is refused
naming the field, and a cost outside the declared interval widened by the tolerance is
drift, with the same message shape as the ONNX gate's. `policyc modelserver --engine
vllm|emulator` runs it before serving a folder (the model is on that side; the decision
service only receives the contract).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from policyc.compiler.bundle import Contract

from .validate import DEFAULT_TOLERANCE, within

CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 1 << 20
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}


@dataclass(frozen=True, slots=True)
class LlmShape:
    """A decoder's shape as `config.json` gives it."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int | None
    dtype_bytes: int | None

    def flops_per_token(self) -> int:
        h, d = self.hidden, self.head_dim
        per_layer = 2 * (h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h + 3 * h * self.intermediate)
        return self.layers * per_layer + 2 * h * self.vocab

    def kv_bytes_per_token(self) -> int | None:
        if self.dtype_bytes is None:
            return None
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def describe(self) -> str:
        return (f"{self.layers} layers, hidden size {self.hidden}, {self.heads} heads ({self.kv_heads} KV) of {self.head_dim}, "
                f"intermediate {self.intermediate}, vocabulary {self.vocab}")


@dataclass(frozen=True, slots=True)
class LlmCheck:
    """The verdict: `ok`, one message in the gate's words, and every problem found."""

    ok: bool
    message: str
    counted: int | None = None
    problems: tuple[str, ...] = ()


class LlmConfigError(ValueError):
    """`config.json` missing, unreadable, or without a decoder's shape (`.field` names it)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _int(cfg: dict[str, object], key: str, where: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        shown = "missing" if key not in cfg and default is None else f"{v!r}"
        raise LlmConfigError(f"{where}: `{key}` must be a positive whole number ({shown})", key)
    return v


def read_shape(model_dir: Path) -> LlmShape:
    """The decoder's shape from `model_dir/config.json`; LlmConfigError naming the problem."""
    path = model_dir / CONFIG_FILE
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise LlmConfigError(f"{path}: cannot read the model's config ({e.strerror or e})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise LlmConfigError(f"{path}: larger than {MAX_CONFIG_BYTES:,} bytes; not a model config")
    try:
        cfg = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise LlmConfigError(f"{path}: not JSON ({str(e)[:120]})") from None
    if not isinstance(cfg, dict):
        raise LlmConfigError(f"{path}: not a JSON object")
    where = str(path)
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    head_dim = _int(cfg, "head_dim", where) if cfg.get("head_dim") is not None else hidden // heads
    if head_dim <= 0:
        raise LlmConfigError(f"{where}: `hidden_size` {hidden} is smaller than `num_attention_heads` {heads}", "hidden_size")
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    max_pos = cfg.get("max_position_embeddings")
    return LlmShape(
        hidden=hidden,
        layers=_int(cfg, "num_hidden_layers", where),
        heads=heads,
        kv_heads=_int(cfg, "num_key_value_heads", where, heads),
        head_dim=head_dim,
        intermediate=_int(cfg, "intermediate_size", where),
        vocab=_int(cfg, "vocab_size", where),
        max_positions=max_pos if isinstance(max_pos, int) and not isinstance(max_pos, bool) and max_pos > 0 else None,
        dtype_bytes=DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None,
    )


def _outside(counted: float, lo: float, hi: float) -> float:
    return (counted - lo) / lo if counted < lo else (counted - hi) / hi if counted > hi else 0.0


def check_llm_config(model_dir: Path, contract: Contract, *, tolerance: float = DEFAULT_TOLERANCE) -> LlmCheck:
    """The contract's per-token cost against the folder's `config.json`; never raises for bad input."""
    where = str(model_dir / CONFIG_FILE)
    try:
        shape = read_shape(model_dir)
    except LlmConfigError as e:
        return LlmCheck(False, str(e), problems=(str(e),))
    counted = shape.flops_per_token()
    problems: list[str] = []

    def cost(field: str, lo: float, hi: float) -> None:
        if not within(counted, lo, hi, tolerance):
            rng = f"{lo:.4g}" if lo == hi else f"{lo:.4g}..{hi:.4g}"
            problems.append(f"`{field}` declares {rng} FLOPs per token ({_outside(counted, lo, hi):+.1%} outside the interval)")

    c = contract.compute
    if c.per == "token":
        cost("compute.flops", c.flops.lo, c.flops.hi)
    if contract.llm is not None:
        cost("llm.prefill", contract.llm.prefill_flops, contract.llm.prefill_flops)
        cost("llm.decode", contract.llm.decode_flops, contract.llm.decode_flops)
        kv = shape.kv_bytes_per_token()
        declared_kv = contract.llm.kv_bytes_per_token
        if kv is not None and declared_kv is not None and not within(kv, declared_kv, declared_kv, tolerance):
            problems.append(f"`llm.kv_cache` declares {declared_kv:.4g} B a token, the shape holds {kv:,} B")
        if shape.max_positions is not None and contract.llm.context > shape.max_positions:
            problems.append(f"`llm.context` {contract.llm.context:,} exceeds the model's max_position_embeddings {shape.max_positions:,}")
    elif c.per != "token":
        problems.append("the contract gives no per-token cost (`flops_per_token` or an `llm` block) to check")
    unit = f"FLOPs per token counted from the config ({shape.describe()})"
    if not problems:
        return LlmCheck(True, f"{where}: contract `{contract.name}` holds: {counted:.4g} {unit}", counted)
    msg = (f"{where}: contract drift in `{contract.name}`: {counted:.4g} {unit}; " + "; ".join(problems)
           + f" (tolerance {tolerance:.0%})")
    return LlmCheck(False, msg, counted, tuple(problems))
