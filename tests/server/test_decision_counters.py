"""The cheap decision counters expose what prometheus_client's Counter and Histogram did:
the same names, labels, cumulative buckets, sums and counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policyc.server.decision import Decision, Outcome, Rejection, Stage, Timing
from policyc.server.decision_counters import DecisionCounters


def _decision(outcome: Outcome, timing: Timing, rejection: Rejection | None = None) -> Decision:
    return Decision("d-1", outcome, "sha256:x", None, {}, (), 0, None, None, rejection, timing)


def _samples(c: DecisionCounters) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry()
    reg.register(c)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counts_by_outcome_and_reason_and_latency_buckets() -> None:
    c = DecisionCounters()
    c.observe(_decision(Outcome.ADMITTED, Timing(10e-6, 3e-6, 40e-6, 150e-6, 203e-6)))
    c.observe(_decision(Outcome.ADMITTED, Timing(10e-6, 3e-6, 40e-6, 2e-3, 2.053e-3)))
    c.observe(_decision(Outcome.REJECTED, Timing(10e-6, 3e-6, 0.0, 0.0, 13e-6), Rejection(Stage.FEASIBILITY, "no")))
    c.observe(_decision(Outcome.REJECTED, Timing(10e-6, 3e-6, 40e-6, 1e-4, 2e-4), Rejection(Stage.PLACEMENT, "no", binding="dependency")))
    s = _samples(c)
    assert s[("policyc_decisions_total", (("outcome", "admitted"), ("reason", "ok")))] == 2
    assert s[("policyc_decisions_total", (("outcome", "rejected"), ("reason", "feasibility")))] == 1
    assert s[("policyc_decisions_total", (("outcome", "rejected"), ("reason", "dependency")))] == 1
    assert c.count("admitted", "ok") == 2 and c.count("rejected", "match") == 0
    assert c.totals() == {("admitted", "ok"): 2, ("rejected", "feasibility"): 1, ("rejected", "dependency"): 1}
    total = (("le", "0.0002"),)
    assert s[("policyc_decision_seconds_bucket", total)] == 2  # 13 µs and 200 µs (le is inclusive)
    assert s[("policyc_decision_seconds_bucket", (("le", "0.002"),))] == 3  # not 2.053 ms
    assert s[("policyc_decision_seconds_bucket", (("le", "+Inf"),))] == 4
    assert s[("policyc_decision_seconds_count", ())] == 4
    assert abs(s[("policyc_decision_seconds_sum", ())] - (203e-6 + 2.053e-3 + 13e-6 + 2e-4)) < 1e-12
    # stages that took no time are not observed: the solver's rejection has no match or placement
    assert s[("policyc_decision_stage_seconds_count", (("stage", "place"),))] == 3
    assert s[("policyc_decision_stage_seconds_count", (("stage", "parse"),))] == 4
    # the total is not one of the stages: a sum over `stage` counts each decision's parts once
    assert not any(name.startswith("policyc_decision_stage_seconds") and ("stage", "total") in labels for name, labels in s)


def test_no_decisions_yet_exposes_an_empty_total_histogram() -> None:
    s = _samples(DecisionCounters())
    assert s[("policyc_decision_seconds_count", ())] == 0
    assert not any(name == "policyc_decisions_total" for name, _ in s)


def test_queued_decisions_fold_into_the_same_counts_as_one_by_one() -> None:
    """Decision times are queued and folded in batches (and at every scrape): across several
    folds and a partial batch, the buckets, sums and counts are what adding each one gives."""
    import random

    from policyc.server.decision_counters import FOLD_AT, STAGES, _Histogram

    rng = random.Random(3)
    c = DecisionCounters()
    want_total, want_stages = _Histogram(), [_Histogram() for _ in STAGES]
    n = 3 * FOLD_AT + 17
    for i in range(n):
        parts = [rng.choice((0.0, 50e-6, rng.uniform(0, 3e-3))) for _ in STAGES]  # exact bounds and zeros too
        t = Timing(*parts, sum(parts))
        c.observe(_decision(Outcome.ADMITTED if i % 3 else Outcome.REJECTED, t,
                            None if i % 3 else Rejection(Stage.MATCH, "none")))
        want_total.add(t.total)
        for h, v in zip(want_stages, parts):
            if v:
                h.add(v)
        if i == FOLD_AT // 2:
            assert c.count("rejected", "match") == FOLD_AT // 6 + 1  # counted at once; only the times wait for a fold
    s = _samples(c)
    assert c.count("admitted", "ok") + c.count("rejected", "match") == n
    assert s[("policyc_decision_seconds_count", ())] == n
    assert abs(s[("policyc_decision_seconds_sum", ())] - want_total.total) < 1e-9
    for bound, cum in want_total.cumulative():
        assert s[("policyc_decision_seconds_bucket", (("le", str(float(bound)) if bound != "+Inf" else "+Inf"),))] == cum
    for name, h in zip(STAGES, want_stages):
        assert s[("policyc_decision_stage_seconds_count", (("stage", name),))] == sum(h.counts)
        for bound, cum in h.cumulative():
            le = str(float(bound)) if bound != "+Inf" else "+Inf"
            assert s[("policyc_decision_stage_seconds_bucket", (("le", le), ("stage", name)))] == cum
