"""An LLM request is priced by its own tokens (issue 37): its GPU share, its predicted
compute and its feasibility come from its `prompt_tokens` and `max_tokens` on each GPU
class of the catalog, not from the contract's constant `compute.tokens`; a prompt whose
prefill cannot meet the contract's TTFT on any class is refused by feasibility, naming
the contract's `llm.ttft` line."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_rig import REPO, SMALL

from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.placer.plan import ShareSource
from policyc.server.app import DecisionServer
from policyc.server.config import ServeConfig
from policyc.server.decision import Decision, DecisionInput, Outcome, Stage
from policyc.server.fleet import admissible_fleet

# A 7B-class chat model: ~1.4e10 FLOPs a token, prefill and decode.
BIG_CHAT = """contract big-chat version "1.0.0" {
  compute {
    flops_per_token: 1.4e10 .. 1.4e10
    tokens: 256
    precision: bf16
    efficiency: 40 %
  }
  memory {
    bandwidth: >= 1 GB/s
    burst: <= 1 s
  }
  dependencies {
    async_callbacks: no
    cuda: >= 12.1
  }
  slo {
    latency: <= 10 s
    allowance: 50 ms
  }
  llm {
    prefill: 1.4e10 FLOP
    decode: 1.4e10 FLOP
    context: 131072
    ttft: <= 200 ms
    tpot: <= 50 ms
  }
}
"""
TTFT_LINE = 1 + BIG_CHAT.splitlines().index("    ttft: <= 200 ms")


@pytest.fixture(scope="module")
def llm_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundle, Path]:
    d = tmp_path_factory.mktemp("llm")
    (d / "big-chat.contract").write_text(BIG_CHAT)
    r = compile_paths([str(REPO / "policies"), str(d)], analyse=True)
    assert r.ok and r.bundle is not None, [str(x) for x in r.diagnostics if x.is_error]
    return r.bundle, d


@pytest.fixture(scope="module")
def server(llm_bundle: tuple[Bundle, Path]) -> DecisionServer:
    bundle, _ = llm_bundle
    s = DecisionServer(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    assert s.cluster is not None
    s.engine.register_many(admissible_fleet(bundle, s.cluster.gpu_slots(), models=["big-chat", "support-chatbot"]))
    return s


def ask(server: DecisionServer, prompt: float | None, max_tokens: float | None = 16.0) -> Decision:
    attrs: dict[str, float] = {}
    if prompt is not None:
        attrs["prompt_tokens"] = prompt
    if max_tokens is not None:
        attrs["max_tokens"] = max_tokens
    return server.engine.decide(DecisionInput({"X-Model": "big-chat", "X-Tenant": "shopwave"}, attrs))


def test_prompts_of_10_and_900_tokens_get_their_own_share_and_latency(server: DecisionServer) -> None:
    short, long = ask(server, 10.0), ask(server, 900.0)
    for d in (short, long):
        assert d.outcome is Outcome.ADMITTED and d.plan is not None, d.rejection
        assert d.plan.share_source is ShareSource.REQUEST
    assert short.plan is not None and long.plan is not None
    # 900 prompt tokens: the prefill within the 200 ms TTFT needs ~90x the 10-token share
    assert long.plan.share > 20 * short.plan.share
    assert long.plan.latency.compute > short.plan.latency.compute
    why = " | ".join(long.plan.reasons)
    assert "from the request (priced by this request: the prefill of 900 prompt tokens" in why, why
    assert "200 ms time to first token" in why
    # the same model without a prompt (a client that sent only headers) is priced at the contract's constant
    plain = ask(server, None, None)
    assert plain.outcome is Outcome.ADMITTED and plain.plan is not None
    assert plain.plan.share_source is not ShareSource.REQUEST


def test_a_class_too_slow_for_the_prompt_is_refused_with_the_reason(server: DecisionServer) -> None:
    # 4,000 prompt tokens: 5.6e13 FLOPs of prefill; within 200 ms only the fastest classes can
    d = ask(server, 4000.0)
    assert d.outcome is Outcome.ADMITTED and d.plan is not None, d.rejection
    fast = d.plan.gpu_model
    rejected = list(d.plan.rejected)
    slow = [r for r in rejected if r.constraint.value == "gpu_share" and "cannot be served on" in r.detail]
    assert slow, [(r.gpu, r.constraint, r.detail) for r in rejected]
    assert "time to first token" in slow[0].detail and "of a whole GPU" in slow[0].detail
    assert fast not in {r.detail.split("`")[1] for r in slow}


def test_a_prefill_over_the_ttft_on_every_class_is_infeasible_with_its_line(server: DecisionServer,
                                                                             llm_bundle: tuple[Bundle, Path]) -> None:
    d = ask(server, 100_000.0)
    assert d.outcome is Outcome.REJECTED and d.rejection is not None
    r = d.rejection
    assert r.stage is Stage.FEASIBILITY, r.reason
    assert "`big-chat` cannot give its first token in time" in r.reason and "100000 prompt tokens" in r.reason
    # the file as the compiler names it (relative to the working directory where it can be)
    assert f"big-chat.contract:{TTFT_LINE};" in r.reason and "(llm.ttft, " in r.reason, r.reason
    assert [(Path(s.file).name, s.line) for s in r.spans] == [("big-chat.contract", TTFT_LINE)]
    # the shape cache merges prompt sizes between rule thresholds: a feasible prompt after
    # the refused one is answered on its own tokens, and the refused one again after it
    assert ask(server, 100.0).outcome is Outcome.ADMITTED
    assert ask(server, 100_000.0).rejection is not None


def test_non_llm_models_are_priced_as_before(server: DecisionServer) -> None:
    d = server.engine.decide(DecisionInput({"X-Model": "support-chatbot", "X-Tenant": "shopwave"}, {"prompt_tokens": 900.0}))
    assert d.outcome is Outcome.ADMITTED and d.plan is not None, d.rejection
    assert d.plan.share_source is not ShareSource.REQUEST
