"""Guardian semantics without the network: the reference pack, classification, self-heal,
quarantine safety, retry budgets, the executor's dry run and the user-space plane."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from enforcer_support import REF, make_bundle  # noqa: E402

from policyc.compiler.bundle import Breaker, CancelStream, Quarantine, Redirect, SignalCondition
from policyc.compiler.pipeline import compile_paths
from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.endpoint import Endpoint, EndpointError
from policyc.enforcer.executor import ActionExecutor, HealTarget
from policyc.enforcer.guardian import Guardian
from policyc.enforcer.quarantine_book import QuarantineBook
from policyc.enforcer.records import ActionKind, Outcome
from policyc.enforcer.retry_budget import RetryBudget
from policyc.enforcer.rule_table import RuleTableError, build_rule_table
from policyc.enforcer.userspace_plane import KernelEnforcementOff, UserSpacePlane

ROOT = Path(__file__).parents[2]


class Anomalies:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, float]] = []

    def report_anomaly(self, gpu_key: str, signal: str, value: float) -> None:
        self.reports.append((gpu_key, signal, value))


def _plane(audit: MemoryAudit) -> UserSpacePlane:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelEnforcementOff)
        return UserSpacePlane(audit, reason="test")


def _reference_bundle():  # type: ignore[no-untyped-def]
    result = compile_paths(sorted((ROOT / "policies").glob("*.contract")), analyse=False)
    assert not [d for d in result.diagnostics if getattr(d, "severity", "error") == "error"]
    return result.bundle


def _guardian(bundle, audit: MemoryAudit, anomalies: Anomalies, rebalanced: list[str]) -> Guardian:  # type: ignore[no-untyped-def]
    return Guardian(bundle, plane=_plane(audit), anomalies=anomalies, audit=audit,
                    executor=ActionExecutor(audit, rebalance=rebalanced.append))


def test_reference_pack_budget_is_185_of_200_ms() -> None:
    bundle = _reference_bundle()
    table = build_rule_table(bundle)
    found = table.budget_for("fraud-scorer")
    assert found is not None
    rule, seconds = found
    assert rule.breaker.name == "slo-budget"
    assert rule.budget == pytest.approx(0.925 * rule.slo) and seconds == rule.budget
    assert table.kernel_rules().stream_budget_ns == int(rule.budget * 1e9)


def test_ten_sm_collapses_self_heal_in_dry_run_and_rebalance() -> None:
    audit, anomalies, rebalanced = MemoryAudit(), Anomalies(), []
    g = _guardian(_reference_bundle(), audit, anomalies, rebalanced)
    g.set_heal_target(HealTarget("node-1/gpu2", "node-1", gpu_index="2", rdma_link="mlx5_0/1"))
    verdicts = [g.observe_gpu("node-1/gpu2", {"sm_utilization": 0.15, "tls_handshake": 0.01}) for _ in range(10)]
    assert [v.fired for v in verdicts[:9]] == [()] * 9
    assert verdicts[9].fired == ("sm-collapse",)
    assert [(s.step, s.outcome) for s in verdicts[9].heal] == [
        ("gpu_reset", Outcome.DRY_RUN), ("rdma_link_refresh", Outcome.DRY_RUN), ("rebalance", Outcome.DONE)]
    assert rebalanced == ["node-1"]
    assert anomalies.reports == [("node-1/gpu2", "sm_utilization", 0.15)]
    steps = [r for r in audit.records if r.kind is ActionKind.SELF_HEAL_STEP]
    assert "nvidia-smi --gpu-reset -i 2" in steps[0].detail and steps[0].dry_run
    g.close()


def test_sm_collapse_with_slow_tls_is_client_network_not_a_gpu_fault() -> None:
    audit, anomalies, rebalanced = MemoryAudit(), Anomalies(), []
    g = _guardian(_reference_bundle(), audit, anomalies, rebalanced)
    for _ in range(9):
        g.observe_gpu("n/gpu0", {"sm_utilization": 0.15, "tls_handshake": 0.01})
    v = g.observe_gpu("n/gpu0", {"sm_utilization": 0.15, "tls_handshake": 0.2})
    assert v.classification is not None and v.classification.cause == "client_network" and v.fired == ()
    for _ in range(9):  # the GPU streak restarted: nine more faults do not heal
        assert g.observe_gpu("n/gpu0", {"sm_utilization": 0.15, "tls_handshake": 0.01}).fired == ()
    assert rebalanced == [] and anomalies.reports == []
    assert any(r.kind is ActionKind.CLASSIFY and "client_network" in r.detail for r in audit.records)
    g.close()


def test_quarantine_cap_backoff_and_expiry() -> None:
    now = 1000.0
    book = QuarantineBook()
    backends = [Endpoint.of("10.0.0.1", 80 + i) for i in range(10)]
    for b in backends:
        book.add_backend(b)
    first = book.decide(backends[0], now, 30, 480, 0.2)
    assert first.allowed and first.duration == 30
    book.record(backends[0], now, 30, 480)
    book.record(backends[1], now, 30, 480)
    refused = book.decide(backends[2], now, 30, 480, 0.2)
    assert not refused.allowed and "cap reached" in refused.reason
    assert book.expired(now + 31) == backends[:2]
    book.released(backends[0])
    again = book.decide(backends[0], now + 40, 30, 480, 0.2)
    assert again.allowed and again.duration == 60  # backs off on repeat


def test_quarantine_cap_allows_one_backend_of_a_small_pool() -> None:
    """20 % of two backends is none; like Envoy's outlier detection, one may still be out
    (its traffic goes to its backup), a second not."""
    book = QuarantineBook()
    a, b = Endpoint.of("10.0.0.1", 80), Endpoint.of("10.0.0.1", 81)
    book.add_backend(a)
    book.add_backend(b)
    assert book.decide(a, 1000.0, 30, 480, 0.2).allowed
    book.record(a, 1000.0, 30, 480)
    refused = book.decide(b, 1000.0, 30, 480, 0.2)
    assert not refused.allowed and "1 of 2 backends out, max share 0.2 allows 1" in refused.reason


def test_backend_rule_quarantines_through_the_plane_and_expires() -> None:
    audit, anomalies, rebalanced = MemoryAudit(), Anomalies(), []
    clock = [0.0]
    rule = Breaker(name="failing", scope="backend",
                   conditions=(SignalCondition(signal="error_rate", cmp=">", value=0.5, origin=REF),), consecutive=2,
                   actions=(Quarantine(duration=5, max_duration=40, max_share=0.5),), origin=REF)
    plane = _plane(audit)
    g = Guardian(make_bundle(extra=(rule,)), plane=plane, anomalies=anomalies, audit=audit,
                 executor=ActionExecutor(audit, rebalance=rebalanced.append), clock=lambda: clock[0])
    a, b = Endpoint.of("127.0.0.1", 5001), Endpoint.of("127.0.0.1", 5002)
    g.register_backend(a, b)
    g.register_backend(b, a)
    assert g.observe_backend(a, {"error_rate": 0.9}) == ()
    assert g.observe_backend(a, {"error_rate": 0.9}) == ("failing",)
    assert plane.resolve(a) == b
    g.observe_backend(b, {"error_rate": 0.9})
    g.observe_backend(b, {"error_rate": 0.9})
    assert plane.resolve(b) == b  # cap: at most half of two backends
    assert any(r.kind is ActionKind.QUARANTINE and r.outcome is Outcome.REFUSED for r in audit.records)
    clock[0] = 6.0
    assert g.tick() == [a]
    assert plane.quarantined() == {}
    g.close()


def test_retry_budget_limits_retries_to_a_share_of_active_requests() -> None:
    rb = RetryBudget(0.2, min_concurrency=1)
    for _ in range(10):
        rb.request_started()
    assert rb.try_acquire() and rb.try_acquire() and not rb.try_acquire()
    rb.release()
    assert rb.try_acquire()


def test_retry_of_a_retry_is_refused() -> None:
    audit, anomalies = MemoryAudit(), Anomalies()
    g = Guardian(make_bundle(slo=0.02), plane=_plane(audit), anomalies=anomalies, audit=audit,
                 executor=ActionExecutor(audit, rebalance=lambda n: None))

    class Stream:
        cancelled = False

        def cancel(self) -> bool:
            Stream.cancelled = True
            return True

    g.begin("x", "fraud-scorer", Stream(), retry_count=1, on_redirect=lambda p: None)
    import time

    time.sleep(0.08)
    assert Stream.cancelled
    assert [r.outcome for r in audit.records if r.kind is ActionKind.REDIRECT] == [Outcome.REFUSED]
    g.close()


def test_executor_never_runs_hardware_commands_without_opt_in(tmp_path: Path) -> None:
    audit = MemoryAudit()
    marker = tmp_path / "ran"
    ex = ActionExecutor(audit, rebalance=lambda n: None, commands={"gpu_reset": ("touch", str(marker))})
    assert ex.run(("gpu_reset",), HealTarget("h/gpu0", "h"), "r")[0].outcome is Outcome.DRY_RUN
    assert not marker.exists()
    real = ActionExecutor(audit, rebalance=lambda n: None, allow_real=True, commands={"gpu_reset": ("touch", str(marker))})
    assert real.run(("gpu_reset",), HealTarget("h/gpu0", "h"), "r")[0].outcome is Outcome.DONE
    assert marker.exists()


def test_userspace_plane_says_loudly_that_kernel_enforcement_is_off() -> None:
    with pytest.warns(KernelEnforcementOff, match="KERNEL ENFORCEMENT IS OFF"):
        UserSpacePlane(reason="not root")


def test_bad_rules_and_endpoints_get_clear_errors() -> None:
    bad = Breaker(name="b", scope="gpu", conditions=(), actions=(), origin=REF)
    with pytest.raises(RuleTableError, match=r"tests/enforcer:1:1: breaker `b` has no conditions"):
        build_rule_table(make_bundle(extra=(bad,)))
    with pytest.raises(EndpointError, match="expected host:port"):
        Endpoint.parse("localhost")
    assert Endpoint.parse("[::ffff:127.0.0.1]:80") == Endpoint.of("127.0.0.1", 80)


def _on_prediction(factor: float, at_least: float | None = None) -> Breaker:
    """`elapsed >= factor of predicted` (and `elapsed >= at_least` seconds when given)."""
    conds = [SignalCondition(signal="elapsed", cmp=">=", value=factor, of="predicted", origin=REF)]
    if at_least is not None:
        conds.append(SignalCondition(signal="elapsed", cmp=">=", value=at_least, origin=REF))
    return Breaker(name="slow-placement", scope="request", models=("fraud-scorer",), conditions=tuple(conds),
                   actions=(CancelStream(), Redirect(backup="fraud-scorer", headers=(("X-Retry-Count", "1"),))), origin=REF)


@pytest.mark.parametrize("predicted, rule, seconds", [
    (None, "slo-budget", 0.185),  # no placement prediction: only the SLO rule applies
    (0.0, "slo-budget", 0.185),  # nor with a prediction that is no latency
    (0.05, "slow-placement", 0.10),  # twice 50 ms comes before 185 ms
    (0.09, "slow-placement", 0.18),
    (0.095, "slo-budget", 0.185),  # twice 95 ms is past the SLO rule
    (0.15, "slo-budget", 0.185),  # twice 150 ms is past the SLO rule
])
def test_budget_on_the_prediction_fires_first_only_when_it_is_earlier(predicted: float | None, rule: str, seconds: float) -> None:
    table = build_rule_table(make_bundle(extra=(_on_prediction(2.0),)))
    found = table.budget_for("fraud-scorer", predicted)
    assert found is not None
    assert (found[0].breaker.name, found[1]) == (rule, pytest.approx(seconds))


def test_budget_on_the_prediction_is_never_a_kernel_budget_and_combines_with_a_fixed_one() -> None:
    table = build_rule_table(make_bundle(extra=(_on_prediction(2.0, at_least=0.03),)))
    assert table.kernel_rules().budgets_ns == {table.ids["slo-budget"]: 185_000_000}
    rule = next(b for b in table.budgets if b.breaker.name == "slow-placement")
    assert (rule.budget, rule.of_predicted) == (0.03, 2.0)
    assert rule.seconds(0.01) == pytest.approx(0.03)  # both conditions must hold: the later one
    assert rule.seconds(0.05) == pytest.approx(0.10)
    assert rule.seconds(None) is None


def test_reference_pack_breaks_a_request_at_three_times_its_predicted_latency() -> None:
    """`slow-placement` in policies/breakers.contract: a request placed with a 10 ms prediction
    is cancelled at 30 ms, long before the 185 ms SLO budget, and redirected once to the
    backup with X-Retry-Count: 1; its GPU is reported."""
    import threading
    import time

    audit, anomalies = MemoryAudit(), Anomalies()
    g = _guardian(_reference_bundle(), audit, anomalies, [])
    cancelled, plans = threading.Event(), []

    class Stream:
        def cancel(self) -> bool:
            cancelled.set()
            return True

    start = time.monotonic()
    deadline = g.begin("r1", "fraud-scorer", Stream(), gpu_key="node-1/gpu3", on_redirect=plans.append, predicted=0.01)
    assert deadline == pytest.approx(start + 0.03, abs=0.005)
    assert cancelled.wait(1.0)
    assert time.monotonic() - start < 0.15
    g.finish("r1")
    for _ in range(200):  # the break's other acts follow the cancel on the watch's second thread
        if plans and anomalies.reports and any(r.kind is ActionKind.CANCEL_STREAM for r in audit.records):
            break
        time.sleep(0.005)
    assert [(p.backup, p.variant, p.headers, p.rule) for p in plans] == [
        ("fraud-scorer-lite", "simplified", (("x-retry-count", "1"),), "slow-placement")]
    assert [a[0] for a in anomalies.reports] == ["node-1/gpu3"]
    cancel = next(r for r in audit.records if r.kind is ActionKind.CANCEL_STREAM)
    assert cancel.rule == "slow-placement" and "budget 30.0 ms" in cancel.detail
    g.close()
