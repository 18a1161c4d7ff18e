"""The compiler is its stage table: `STAGES` runs in order, `stop_after` stops after the
named stage with what that stage left, and a name that is no stage is refused."""

from __future__ import annotations

import pytest

from policy_text import BASE_CONTRACT, REQUESTS, compile_text

from policyc.compiler.pipeline import STAGE_NAMES, STAGES, compile_sources
from policyc.dsl.source import Source

POLICY = REQUESTS + BASE_CONTRACT + "policy p {\n  rule r { when: has(request.slo)  require: slo_latency <= request.slo }\n}\n"


def run(stop_after: str | None, analyse: bool = True):  # type: ignore[no-untyped-def]
    return compile_sources([Source("f0.contract", POLICY)], analyse=analyse, stop_after=stop_after)


def test_the_stage_table_is_the_pipeline() -> None:
    assert STAGE_NAMES == ("parse", "lower", "resolve", "plan", "analyse", "emit")
    assert all(callable(fn) and fn.__name__ for _, fn in STAGES)


@pytest.mark.parametrize("stage", ["parse", "lower", "resolve"])
def test_before_plan_there_is_no_bundle(stage: str) -> None:
    r = run(stage)
    assert r.bundle is None and not r.errors


def test_plan_gives_the_unsealed_bundle_with_its_latency_targets() -> None:
    b = run("plan").bundle
    assert b is not None and b.content_hash == "" and b.latency_targets == ("slo",)
    assert all(not c.gpu_shares for c in b.contracts)  # the solver has not run
    assert [r.id for r in b.rules] == ["p.r"]


def test_analyse_adds_the_shares_and_emit_seals() -> None:
    analysed = run("analyse").bundle
    assert analysed is not None and analysed.content_hash == ""
    sealed = run(None).bundle
    assert sealed is not None and sealed.content_hash.startswith("sha256:")
    assert sealed.model_copy(update={"content_hash": ""}) == analysed
    assert run("emit").bundle == sealed


def test_without_analysis_emit_seals_a_bundle_without_shares() -> None:
    b = run(None, analyse=False).bundle
    assert b is not None and b.content_hash.startswith("sha256:") and all(not c.gpu_shares for c in b.contracts)


def test_an_unknown_stage_is_refused_naming_the_stages() -> None:
    with pytest.raises(ValueError, match="no compiler stage `lowr`; the stages are parse, lower, resolve, plan, analyse, emit"):
        run("lowr")
    with pytest.raises(ValueError, match="analyse=False"):
        run("analyse", analyse=False)


def test_errors_stop_the_run_at_the_stage_that_found_them() -> None:
    r = compile_text(BASE_CONTRACT.replace("tokens: 128", "tokens: $128"))  # a syntax error: parse stops it
    assert r.bundle is None and [d.code for d in r.errors] == ["E101"]
