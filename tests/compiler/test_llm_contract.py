"""A contract's `llm` block: lowered to SI per-token figures, units checked with located
diagnostics, required fields named; the body's request variables usable in rules and not
feedable by a header; one meaning for a request's cost (`meaning.llm_cost`)."""

from __future__ import annotations

import pytest

from policyc.compiler import meaning
from policyc.compiler.pipeline import compile_sources
from policyc.dsl.source import Source

BASE = """contract chat version "1.0" {
  compute {
    flops_per_token: 1e6 .. 2e6
    tokens: 256
  }
  memory {
    bandwidth: >= 1 GB/s
    burst: <= 1 s
  }
  dependencies {
    async_callbacks: no
    cuda: >= 12.1
  }
  llm {
LLM  }
}
"""
GOOD = """    prefill: 2 MFLOP
    decode: 3e6 FLOP
    kv_cache: 1 KiB
    context: 4096
    ttft: <= 200 ms
    tpot: <= 20 ms
"""


def compile_llm(fields: str, extra: str = "") -> tuple[object, list[str]]:
    r = compile_sources([Source("chat.contract", BASE.replace("LLM", fields) + extra)], analyse=False)
    return r.bundle, [f"{d.code} {d.span.line if d.span else 0}:{d.span.col if d.span else 0} {d.message}"
                      for d in r.diagnostics if d.is_error]


def test_the_llm_block_in_si() -> None:
    bundle, errors = compile_llm(GOOD)
    assert not errors and bundle is not None
    llm = bundle.contract("chat").llm  # type: ignore[attr-defined]
    assert (llm.prefill_flops, llm.decode_flops, llm.kv_bytes_per_token, llm.context) == (2e6, 3e6, 1024.0, 4096)
    assert llm.ttft == pytest.approx(0.2) and llm.tpot == pytest.approx(0.02)


@pytest.mark.parametrize(("fields", "code", "where", "words"), [
    (GOOD.replace("ttft: <= 200 ms", "ttft: <= 2 GB"), "E303", "19:", "`ttft` expects a time"),
    (GOOD.replace("prefill: 2 MFLOP", "prefill: 2 ms"), "E303", "15:", "`prefill` expects"),
    (GOOD.replace("context: 4096", "context: 4 KB"), "E314", "18:", "`context` expects a whole number"),
    (GOOD.replace("    decode: 3e6 FLOP\n", ""), "E204", "", "missing required field `decode`"),
    (GOOD.replace("tpot: <= 20 ms", "tpot: 20 ms"), "E306", "20:", "`tpot` is a maximum"),
], ids=["ttft-size", "prefill-time", "context-size", "no-decode", "tpot-unbounded"])
def test_llm_fields_are_typed_and_located(fields: str, code: str, where: str, words: str) -> None:
    _, errors = compile_llm(fields)
    assert any(e.startswith(code) and where in e and words in e for e in errors), errors


def test_body_variables_in_rules_and_not_from_headers() -> None:
    rule = """
policy limits {
  rule long-prompts {
    when: request.prompt_tokens > 800 and request.stream
    require: model != chat
  }
}
"""
    bundle, errors = compile_llm(GOOD, rule)
    assert not errors and bundle is not None
    header = """
request {
  header X-Prompt-Tokens {
    var: prompt_tokens
    type: count
    missing: ignore
    malformed: reject
  }
}
"""
    _, errors = compile_llm(GOOD, header)
    assert any(e.startswith("E401") and "computed by policyc" in e for e in errors), errors


def test_llm_cost_is_the_request_own_tokens() -> None:
    bundle, _ = compile_llm(GOOD)
    llm = bundle.contract("chat").llm  # type: ignore[attr-defined]
    cost = meaning.llm_cost(llm, 1000, 100, rate=1e9, share=0.5)
    assert cost.flops == 2e6 * 1000 + 3e6 * 100
    assert cost.ttft_s == pytest.approx(2e9 / 5e8) and cost.total_s == pytest.approx((2e9 + 3e8) / 5e8)
    assert cost.kv_bytes == 1024.0 * 1100
    assert meaning.llm_budget(llm, 11) == pytest.approx(0.2 + 0.02 * 10)
    assert meaning.llm_budget(llm, 11, ttft=1.0) == pytest.approx(1.0 + 0.02 * 10)
