"""Lower a contract's `llm { … }` block: what an LLM costs per token and promises per token.

    llm {
      prefill: 2.1e8 FLOP      # FLOPs per prompt token
      decode: 2.1e8 FLOP       # FLOPs per output token
      kv_cache: 4 KiB          # KV-cache bytes a token holds
      context: 1024            # tokens, prompt and output together
      ttft: <= 500 ms          # time to first token
      tpot: <= 50 ms           # time per output token after the first
    }

Units are part of the type (a time where FLOPs are expected is E303, located); `prefill`,
`decode` and `context` are required, the rest optional. A request's cost from these and its
own tokens is `meaning.llm_cost`; its budget, `meaning.llm_budget`.
"""

from __future__ import annotations

from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic

from .bundle import Llm, SourceRef
from .fields import BlockReader, ref

MAX_CONTEXT = 100_000_000  # tokens
FIELDS = ("prefill", "decode", "kv_cache", "context", "ttft", "tpot")


def lower_llm(block: ast.Block, where: str, diags: list[Diagnostic], origins: dict[str, SourceRef]) -> Llm | None:
    n_before = len(diags)
    r = BlockReader(block, f"`llm` of {where}", diags, fields=FIELDS)
    prefill = r.quantity("prefill", "flops", required=True)
    decode = r.quantity("decode", "flops", required=True)
    kv = r.quantity("kv_cache", "size")
    context = r.integer("context", required=True, maximum=MAX_CONTEXT)
    ttft = r.bound("ttft", "time", "max")
    tpot = r.bound("tpot", "time", "max")
    for k in FIELDS:
        f = r.fields.get(k)
        if f is not None:
            origins[f"llm.{k}"] = ref(f.span)
    if len(diags) > n_before or prefill is None or decode is None or context is None:
        return None
    return Llm(prefill_flops=prefill, decode_flops=decode, context=context, kv_bytes_per_token=kv, ttft=ttft, tpot=tpot)
