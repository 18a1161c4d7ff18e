"""`Guardian.observe_gpus` (one signal for many GPUs, skipping the ones it cannot change)
against the reference: `observe_gpu` called for every GPU, tick after tick. Same rules
fired, same anomalies reported, same audit records, same streaks."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from policyc.compiler.bundle import Breaker, SignalCondition
from policyc.compiler.pipeline import compile_paths
from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.executor import ActionExecutor
from policyc.enforcer.guardian import Guardian
from policyc.enforcer.userspace_plane import KernelEnforcementOff, UserSpacePlane

ROOT = Path(__file__).parents[2]
SM = "sm_utilization"
KEYS = [f"node-{i // 4}/gpu{i % 4}" for i in range(8)]


class Anomalies:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, float]] = []

    def report_anomaly(self, gpu_key: str, signal: str, value: float) -> None:
        self.reports.append((gpu_key, signal, value))


def _bundle(extra: bool):  # type: ignore[no-untyped-def]
    """The example policies; with `extra`, also a GPU rule of two conditions on the signal
    (a band) and one on the signal and another (never holds with one signal present)."""
    bundle = compile_paths(sorted((ROOT / "policies").glob("*.contract")), analyse=False).bundle
    assert bundle is not None
    if not extra:
        return bundle
    base = next(b for b in bundle.breakers if b.scope == "gpu")
    cond = base.conditions[0]

    def rule(name: str, conds: tuple[SignalCondition, ...], consecutive: int) -> Breaker:
        return base.model_copy(update={"name": name, "conditions": conds, "consecutive": consecutive})

    band = rule("sm-band", (cond.model_copy(update={"cmp": ">=", "value": 0.4}),
                            cond.model_copy(update={"cmp": "<", "value": 0.45})), 2)
    pair = rule("sm-and-tls", (cond, cond.model_copy(update={"signal": "tls_handshake", "cmp": ">", "value": 0.1})), 1)
    return bundle.model_copy(update={"breakers": (*bundle.breakers, band, pair)})


def _guardian(bundle):  # type: ignore[no-untyped-def]
    audit, anomalies = MemoryAudit(), Anomalies()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelEnforcementOff)
        plane = UserSpacePlane(audit, reason="test")
    g = Guardian(bundle, plane=plane, anomalies=anomalies, audit=audit, executor=ActionExecutor(audit, rebalance=lambda _: None))
    return g, audit, anomalies


values = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.1, 0.15, 0.2, 0.4, 0.44, 0.45, float("nan")]))


@settings(max_examples=60, deadline=None)
@given(ticks=st.lists(st.lists(values, min_size=len(KEYS), max_size=len(KEYS)), min_size=1, max_size=30),
       extra=st.booleans())
def test_batch_observation_matches_observing_every_gpu(ticks: list[list[float]], extra: bool) -> None:
    bundle = _bundle(extra)
    batch, b_audit, b_anom = _guardian(bundle)
    each, e_audit, e_anom = _guardian(bundle)
    try:
        for tick in ticks:
            got = [(k, v.fired, v.classification) for k, v in batch.observe_gpus(KEYS, SM, np.array(tick))]
            want = [(k, v.fired, v.classification) for k, v in ((k, each.observe_gpu(k, {SM: x})) for k, x in zip(KEYS, tick))]
            assert [x for x in got if x[1]] == [x for x in want if x[1]]  # the same rules fired, in GPU order
            assert {k for k, *_ in want if _[0] or _[1]} <= {k for k, *_ in got}  # nothing that acted was skipped
            assert batch._streaks.counts == each._streaks.counts
        assert b_anom.reports == e_anom.reports
        strip = lambda recs: [(r.kind, r.target, r.rule, r.outcome, r.detail) for r in recs]  # noqa: E731
        assert strip(b_audit.records) == strip(e_audit.records)
    finally:
        batch.close()
        each.close()


def test_only_gpus_a_rule_can_hold_for_or_with_a_running_streak_are_observed() -> None:
    g, _, _ = _guardian(_bundle(False))
    try:
        healthy = np.full(len(KEYS), 0.7)
        assert g.observe_gpus(KEYS, SM, healthy) == []  # nothing holds, nothing running: no work
        collapsed = healthy.copy()
        collapsed[3] = 0.1
        assert [k for k, _ in g.observe_gpus(KEYS, SM, collapsed)] == [KEYS[3]]
        # recovered: still observed once, so that its streak resets, then skipped again
        assert [k for k, _ in g.observe_gpus(KEYS, SM, healthy)] == [KEYS[3]]
        assert g.observe_gpus(KEYS, SM, healthy) == []
    finally:
        g.close()
