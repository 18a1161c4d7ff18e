"""Shared builders for the audit tests (a plain module: tests/ has no packages)."""

from __future__ import annotations

import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.audit.accounting import measured
from policyc.audit.log import AuditLog
from policyc.audit.records import ActionRecord, DecisionRecord, Figure, Latency, MatchedRule, Placement, Resources, Source
from policyc.compiler.bundle import SourceRef

MODELS = ("recommender", "chatbot", "fraud")
TENANTS = ("acme", "globex")
REGIONS = ("us-west", "eu-central")


def decision(i: int, *, t: float | None = None, **over: object) -> DecisionRecord:
    fields: dict[str, object] = dict(
        time=t if t is not None else time.time(),
        decision_id=f"dec-{i:06d}",
        tenant=TENANTS[i % 2],
        model=MODELS[i % 3],
        request={"X-SLO-Latency": "150ms", "X-Data-Region": REGIONS[i % 2], "Authorization": f"Bearer tok-{i:08d}-secret"},
        variables={"slo_latency": 0.15, "data_region": REGIONS[i % 2]},
        bundle_hash="sha256:" + "ab" * 32,
        outcome="admitted" if i % 5 else "rejected",
        reason=None if i % 5 else "no instance satisfies finance.require_tpm",
        matched_rules=(MatchedRule(id="finance.require_tpm", origin=SourceRef(file="policies/finance.contract", line=12, col=5)),),
        placement=Placement(instance=f"inst-{i % 7}", host="h1", gpu="gpu0", gpu_model="A100-80G", region=REGIONS[i % 2], share=0.25, predicted_latency=0.138),
        latency=Latency(total=0.00021, stages={"match": 0.00004, "place": 0.00015}),
        resources=Resources(
            gpu_seconds=Figure(value=0.0096, source=Source.ESTIMATED, method="contract", low=0.0077, high=0.0115),
            memory_bytes=Figure(value=3.1e9, source=Source.ESTIMATED, method="contract"),
            network_bytes=measured(4096.0 + i, "kernel_flow_counters"),
        ),
    )
    fields.update(over)
    return DecisionRecord(**fields)  # type: ignore[arg-type]


def action(i: int, decision_id: str | None = None, **over: object) -> ActionRecord:
    fields: dict[str, object] = dict(
        time=time.time(),
        kind="redirect",
        target=f"backend-{i}",
        rule="budget.slo_break",
        rule_origin=SourceRef(file="policies/breakers.contract", line=4, col=1),
        outcome="done",
        dry_run=False,
        decision_id=decision_id,
        detail="redirected to recommender-lite with X-Retry-Count: 1",
    )
    fields.update(over)
    return ActionRecord(**fields)  # type: ignore[arg-type]


def fill(path: Path, n: int, *, key: Ed25519PrivateKey | None = None, every: int = 50, t0: float | None = None) -> None:
    """A closed log of `n` decisions (every 10th followed by an action)."""
    with AuditLog.open(path, signing_key=key, checkpoint_every=every, durability="normal") as log:
        receipts = []
        for i in range(n):
            rec = decision(i, t=None if t0 is None else t0 + i)
            receipts.append(log.submit_decision(rec))
            if i % 10 == 9:
                receipts.append(log.submit_action(action(i, rec.decision_id)))
        for r in receipts:
            r.wait()
