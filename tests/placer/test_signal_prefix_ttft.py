"""The prefix-affinity and predicted-TTFT signals, read at the pick: a prompt returns to the
GPU that served its leading blocks until that GPU saturates; the contract's per-token
prefill on each candidate's class ranks a heterogeneous pool, and a request's own TTFT SLO
keeps it off candidates predicted to miss it while one predicted within it is feasible.
Their vectorised terms equal their references; the index and the blocks stay bounded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from placer_support import contract, instances

from policyc.compiler.bundle import Contract, Llm
from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.framework import RequestInputs
from policyc.placer.readings import Reading
from policyc.placer.request_facts import BLOCK_CHARS, CURRENT, RequestFacts, prefix_blocks, prompt_text
from policyc.placer.signals import REGISTRY, SIGNALS
from policyc.placer.signals.gateway_in_flight import InFlightCounts
from policyc.placer.signals.predicted_ttft import PredictedTtft
from policyc.placer.signals.prefix_affinity import PrefixAffinity, PrefixIndex

PREFIX, PREDICTED = REGISTRY["prefix_affinity"], REGISTRY["predicted_ttft"]
H100_RATE = 989e12 * 0.3  # the catalog's bf16 peak at the test contract's efficiency (placer_support: 30 %)


def _llm_contract(prefill_s_per_token_h100: float) -> Contract:
    """placer_support's contract with an `llm` block whose prefill costs this much a token on an H100."""
    base = contract()
    llm = Llm(prefill_flops=prefill_s_per_token_h100 * base.compute.efficiency * 989e12, decode_flops=1e6, context=8192)
    return base.model_copy(update={"llm": llm})


def test_blocks_are_chained_bounded_and_whole() -> None:
    system = "You are the support assistant of company 7. " * 10
    a, b = prefix_blocks(system + "first question"), prefix_blocks(system + "another one entirely")
    shared = len(system) // BLOCK_CHARS
    assert a[:shared] == b[:shared] and a != b  # the same leading text, the same leading hashes
    assert prefix_blocks("x" + system)[:shared] != a[:shared]  # a hash stands for its whole prefix
    assert prefix_blocks("y" * (BLOCK_CHARS - 1)) == ()  # a partial block is not cached by a server
    assert len(prefix_blocks("z" * 10**6)) == 256  # a huge prompt hashes its first blocks only
    assert prefix_blocks(system) == prefix_blocks(system)  # stable (not Python's salted hash)
    chat = prompt_text("chat", {"messages": [{"role": "system", "content": system},
                                             {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    assert system in chat and "hi" in chat and prompt_text("completions", {"prompt": [1, 2, 3]}) == ""


def test_the_index_counts_consecutive_blocks_and_is_bounded() -> None:
    ix = PrefixIndex(max_blocks=6, per_block=2)
    ix.record((1, 2, 3), "h/gpu0")
    ix.record((1, 2, 9), "h/gpu1")
    assert ix.matched((1, 2, 3, 4), ["h/gpu0", "h/gpu1", "h/gpu2"]).tolist() == [3, 2, 0]
    assert ix.matched((5, 2, 3), ["h/gpu0"]).tolist() == [0]  # consecutive from the first block only
    ix.record((1,), "h/gpu2")  # at most two GPUs a block: the oldest, gpu0, is dropped from block 1
    assert ix.matched((1, 2, 3), ["h/gpu0", "h/gpu1", "h/gpu2"]).tolist() == [0, 2, 1]
    ix.record((10, 11, 12, 13), "h/gpu0")
    assert len(ix) <= 6  # the least recently used blocks are forgotten


_f = st.floats(min_value=0.0, max_value=10.0)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 20), _f, st.booleans(), _f), min_size=1, max_size=40), blocks=st.integers(0, 20))
def test_the_fast_terms_equal_their_references(rows: list[tuple[int, float, bool, float]], blocks: int) -> None:
    assert isinstance(PREFIX, PrefixAffinity) and isinstance(PREDICTED, PredictedTtft)
    assert PREFIX in SIGNALS and PREDICTED in SIGNALS
    matched, prefill, sat, waiting = (np.array(c) for c in zip(*rows))
    assert PREFIX.credit(matched.astype(float), blocks, prefill, sat).tolist() == \
        PREFIX.credit_reference(matched.tolist(), blocks, prefill.tolist(), sat.tolist())
    assert PREDICTED.added(prefill, waiting).tolist() == PREDICTED.added_reference(prefill.tolist(), waiting.tolist())
    for sig in (PREFIX, PREDICTED):  # neither refuses a GPU
        col = sig.reference(RequestInputs(np.ones(len(rows)), np.zeros(len(rows)), prefill, 1.0))
        assert col.fail is not None and not col.fail.any()


def test_saturation_and_the_waiting_queue_read_fresh_readings_only() -> None:
    readings = {"h/gpu0": Reading({"queue_depth": 3.0, "kv_cache_usage": 0.1}, 0.05),
                "h/gpu1": Reading({"queue_depth": 3.0, "kv_cache_usage": 0.9}, 5.0),  # stale: not used
                "h/gpu2": Reading({"queue_depth": 0.0, "kv_cache_usage": 0.95}, 0.05)}
    gpus = ["h/gpu0", "h/gpu1", "h/gpu2", "h/gpu3"]
    assert PREFIX.saturated(readings, gpus, np.array([0, 0, 0, 9.0])).tolist() == [True, False, True, True]
    assert PREDICTED.waiting(readings, gpus).tolist() == [3.0, 0.0, 0.0, 0.0]
    assert PREDICTED.late(np.array([0.1, 0.3, 0.2]), 0.2).tolist() == [False, True, False]


def _placer() -> tuple[Placer, list]:
    sim = SimulatedCluster(seed=7, hosts=4, gpus_per_host=4, hosts_per_rack=2)
    now = [0.0]
    r = Refresher(sim, clock=lambda: now[0])
    r.tick()
    return Placer(r, clock=lambda: now[0]), instances(sim)


def _place(p: Placer, cands: list, c: Contract, facts: RequestFacts | None) -> PlacementPlan:
    token = CURRENT.set(facts)  # what the gateway's LLM picker does around its pick (gateway/llm_pick.py)
    try:
        plan = p.place(cands, 0.5, c)
    finally:
        CURRENT.reset(token)
    assert isinstance(plan, PlacementPlan), plan
    return plan


def test_a_prompt_returns_to_the_gpu_that_served_its_prefix_until_it_saturates() -> None:
    p, cands = _placer()
    h100 = [x for x in cands if x.deployment.gpu_model == "H100"]
    c = _llm_contract(50e-6)  # 1,000 prompt tokens: 50 ms of prefill on an H100
    a = RequestFacts(prefix_blocks("system prompt of tenant A. " * 40 + "q"), 1000.0)
    b = RequestFacts(prefix_blocks("system prompt of tenant B. " * 40 + "q"), 1000.0)
    home_a = _place(p, h100, c, a).gpu_key
    p.in_flight.begin("held", home_a)  # A's home busy for a moment: B's prompt goes elsewhere
    home_b = _place(p, h100, c, b).gpu_key
    p.in_flight.end("held")
    assert home_b != home_a
    # idle again: each prompt returns to the GPU that holds its prefix, though the picker's
    # hysteresis would keep the previous choice (the other GPU) for a prompt it has not seen
    for _ in range(3):
        plan_a = _place(p, h100, c, a)
        assert plan_a.gpu_key == home_a and any("prefix affinity: " + home_a in r for r in plan_a.reasons), plan_a.reasons
        assert _place(p, h100, c, b).gpu_key == home_b
    fresh = _place(p, h100, c, RequestFacts(prefix_blocks("unseen " * 100), 1000.0)).gpu_key
    assert fresh == home_b  # no prefix held anywhere: the hysteresis keeps the last GPU
    # sticky until saturated: at `max_in_flight` of this gateway's requests there, no credit
    for i in range(int(PREFIX.max_in_flight)):
        p.in_flight.begin(f"sat{i}", home_a)
    assert _place(p, h100, c, a).gpu_key != home_a


def test_the_contract_prices_the_prompt_per_class_and_the_ttft_slo_picks_a_class_within_it() -> None:
    p, cands = _placer()
    c = _llm_contract(100e-6)  # 1,000 tokens: 100 ms on an H100, ~3x that on an A100 or L40S
    prompt = RequestFacts((), 1000.0, None)
    plan = _place(p, cands, c, prompt)
    assert plan.gpu_model == "H100" and any("predicted TTFT on " + plan.gpu_key in r for r in plan.reasons)
    # every H100 busy with one of this gateway's requests, measured at 2 s a request: without a
    # TTFT SLO the pick moves to a slower class
    now = [0.0]
    p._picker.in_flight = counts = InFlightCounts(clock=lambda: now[0])
    h100 = [f"{x.deployment.host}/{x.deployment.gpu}" for x in cands if x.deployment.gpu_model == "H100"]
    for i, key in enumerate(h100):
        counts.begin(f"done{i}", key)
        now[0] += 2.0
        counts.end(f"done{i}")
        counts.begin(f"busy{i}", key, 0.1)  # an LLM request, prefilling until its first token
    assert _place(p, cands, c, prompt).gpu_model != "H100"
    # a tight SLO (150 ms) that no candidate is predicted to meet (each H100 has a prefill ahead of
    # this one, the others are slower than 150 ms for this prompt): the plan says so and the load decides
    tight = _place(p, cands, c, RequestFacts((), 1000.0, 0.15))
    assert tight.gpu_model != "H100" and any("no feasible candidate is predicted within the request's 150 ms" in r
                                             for r in tight.reasons), tight.reasons
    # one H100 free again: the tight SLO's request goes there, every other candidate passed over
    counts.end("busy0")
    gold = _place(p, cands, c, RequestFacts((), 1000.0, 0.15))
    assert gold.gpu_key == h100[0], gold.reasons
    assert any(f"within the request's 150 ms ({len(cands) - 1} feasible candidate(s) predicted later" in r
               for r in gold.reasons), gold.reasons
    # every H100 busy again, but each answer past its first token (decoding: a continuous-batching
    # server starts a new prompt beside it): the tight SLO is promised an H100, not an idle slower class
    counts.begin("busy0", h100[0], 0.1)
    for i in range(len(h100)):
        counts.first_token(f"busy{i}", 0.1)
    assert all(counts.count(k) == 1 and counts.prefilling(k) == 0 for k in h100)
    decoding = _place(p, cands, c, RequestFacts((), 1000.0, 0.15))
    assert decoding.gpu_model == "H100", decoding.reasons
    # no facts (a pick that did not read a body): the request-stage prediction adds nothing
    assert not any("predicted TTFT" in r for r in _place(p, cands, c, None).reasons)


def test_the_plan_says_which_part_of_the_prediction_the_gateway_measured() -> None:
    """The plan's predicted TTFT names its sources: the contract's prefill, and the overhead
    the gateway measured on the class (an estimate and a measurement, told apart)."""
    p, cands = _placer()
    c = _llm_contract(100e-6)  # 1,000 tokens: 100 ms on an H100
    slo = RequestFacts((), 1000.0, 0.35)
    plan = _place(p, cands, c, slo)
    assert not any("measured first-token overhead" in r for r in plan.reasons), plan.reasons  # nothing measured yet
    counts = p._picker.in_flight
    counts.begin("a", plan.gpu_key, plan.contract_ttft_s)
    counts.first_token("a", 0.15)  # 50 ms over the contract's 100 ms
    counts.end("a")
    again = _place(p, cands, c, slo)
    assert again.gpu_model == "H100", again.reasons
    assert any("predicted TTFT on " + again.gpu_key in r and "50.0 ms of it the gateway's measured first-token overhead"
               in r for r in again.reasons), again.reasons


def test_a_measured_first_token_over_the_prediction_is_learned_per_class_and_moves_a_tight_slo() -> None:
    """What the contract's FLOPs leave out (an engine's fixed cost per step), measured by the
    gateway on idle servers, is added to the prediction of every GPU of that class: a class
    whose FLOPs fit a tight SLO but whose measured first tokens do not is passed over."""
    p, cands = _placer()
    c = _llm_contract(100e-6)  # 1,000 tokens: 100 ms on an H100, ~317 ms on an A100
    slo = RequestFacts((), 1000.0, 0.35)
    plan = _place(p, cands, c, slo)
    assert plan.gpu_model == "H100" and plan.contract_ttft_s is not None
    assert abs(plan.contract_ttft_s - 0.1) < 1e-3, plan.contract_ttft_s  # the plan carries the contract's figure
    counts = p._picker.in_flight
    # its first token came 400 ms after it was sent, 300 ms over the prediction, on an idle GPU
    counts.begin("a", plan.gpu_key, plan.contract_ttft_s)
    assert counts.first_token("a", 0.4) == pytest.approx(0.3)
    assert counts.first_token("a", 0.9) is None  # learned once per request
    counts.end("a")
    assert counts.overhead(plan.gpu_key) == pytest.approx(0.3)
    # every H100 now predicted 400 ms (the overhead pooled over the class), past the 350 ms SLO:
    # the request goes to a class predicted within it
    after = _place(p, cands, c, slo)
    assert after.gpu_model != "H100", after.reasons
    assert any("within the request's 350 ms" in r for r in after.reasons), after.reasons
    assert after.contract_ttft_s is not None and 0.15 < after.contract_ttft_s < 0.35  # its class's own prefill
    # a request begun on a GPU where this gateway had one in flight is a queue, not an overhead: not learned
    h100 = [f"{x.deployment.host}/{x.deployment.gpu}" for x in cands if x.deployment.gpu_model == "H100"]
    counts.begin("busy", h100[1])
    counts.begin("queued", h100[1], 0.1)
    assert counts.first_token("queued", 5.0) is None and counts.overhead(h100[1]) is None
    # a measurement that is none (negative, past the bound) is not learned either
    counts.begin("odd", h100[2], 0.1)
    assert counts.first_token("odd", -1.0) is None and counts.first_token("odd", float("inf")) is None


def test_tiering_sends_a_loose_slo_to_the_slowest_class_within_headroom() -> None:
    assert PREDICTED.tier(np.array([0.1, 0.3]), np.array([0.1, 0.3]), 5.0) is None  # off by default
    sig = PredictedTtft(headroom=0.5)
    prefill = np.array([0.05, 0.15, 0.15, 0.40])  # an H100, two A100s, an L4 (this prompt's prefill)
    expected = np.array([0.06, 0.20, 0.90, 0.45])
    got = sig.tier(prefill, expected, 1.0)
    assert got is not None and got.tolist() == [False, False, False, True]  # the L4 is within 0.5 s: the slowest class
    got = sig.tier(prefill, expected, 0.5)
    assert got is not None and got.tolist() == [False, True, False, False]  # within 0.25 s: an A100 (not the busy one)
    assert sig.tier(prefill, expected, 0.1) is None  # nothing within 50 ms: no tiering, the late test decides
