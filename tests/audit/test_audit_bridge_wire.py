"""The server bridge builds the writer's struct straight from a decision (`wire_of`): the
writer must store exactly the bytes the plain-values draft (`draft_of`) gives, for real
decisions of the example policies (admitted and refused, several tenants and models)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from policyc.audit.draft_encoder import DecisionWire, encode_draft, wire_draft
from policyc.audit.log import AuditLog
from policyc.audit.verify import verify
from policyc.server.audit_bridge import AuditBridge, draft_of, wire_of
from policyc.server.decision import Decision

from example_decisions import decide_examples

REQUESTS = [
    {"X-SLO-Latency": "150ms", "X-Data-Region": "us-west", "Authorization": "Bearer tok-secret-1"},
    {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"},
    {"X-Tenant": "charite", "X-Data-Region": "eu-west"},
    {"X-Tenant": "shopwave", "X-Model": "fraud-scorer-lite", "X-Data-Region": "us-east"},
    {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer", "X-Data-Region": "eu-west"},
]


@pytest.fixture(scope="module")
def decided() -> tuple[list[tuple[Decision, dict[str, str]]], object]:
    return decide_examples(REQUESTS, 4)


def test_wire_of_stores_the_bytes_draft_of_gives(decided: tuple[list[tuple[Decision, dict[str, str]]], object], tmp_path: Path) -> None:
    decisions, bundle = decided
    outcomes = {d.outcome.value for d, _ in decisions}
    assert len(outcomes) >= 2, outcomes  # admitted and refused both covered
    for d, h in decisions:
        struct = wire_of(d, h, bundle, now=1.7e9)  # type: ignore[arg-type]
        assert isinstance(struct, DecisionWire)
        fast = encode_draft(wire_draft(struct))
        assert fast is not None and fast == encode_draft(wire_draft(draft_of(d, h, bundle, now=1.7e9)))  # type: ignore[arg-type]
    with AuditLog.open(tmp_path / "dicts.db") as log:
        log.submit_decision_drafts([draft_of(d, h, bundle, now=1.7e9) for d, h in decisions])  # type: ignore[arg-type]
    with AuditLog.open(tmp_path / "structs.db") as log:
        log.submit_decision_drafts([wire_of(d, h, bundle, now=1.7e9) for d, h in decisions])  # type: ignore[arg-type]
    bodies = []
    for name in ("dicts.db", "structs.db"):
        with sqlite3.connect(tmp_path / name) as c:
            bodies.append([r[0] for r in c.execute("SELECT body FROM entries ORDER BY seq")])
        assert verify(tmp_path / name).ok
    assert bodies[0] == bodies[1] and len(bodies[0]) == len(decisions)
    assert not any(b"tok-secret" in b for b in bodies[1])


def test_bridge_batches_reach_the_log(decided: tuple[list[tuple[Decision, dict[str, str]]], object], tmp_path: Path) -> None:
    decisions, bundle = decided
    with AuditLog.open(tmp_path / "bridge.db") as log:
        bridge = AuditBridge(log, bundle)  # type: ignore[arg-type]
        for d, h in decisions * 10:  # more than one batch
            bridge.decision(d, h)
        bridge.close()
        assert bridge.failures == 0
    report = verify(tmp_path / "bridge.db")
    assert report.ok and report.entries == len(decisions) * 10


def test_wire_of_renders_a_shapes_variables_once_and_stores_the_same_bytes(
        decided: tuple[list[tuple[Decision, dict[str, str]]], object]) -> None:
    """Decisions of one request shape share its variables mapping: `wire_of` renders it once
    (a memo by the mapping's identity, kept with it) and every record still stores what
    `draft_of` gives; a mapping that is another object, even an equal one, is rendered afresh."""
    import dataclasses

    decisions, bundle = decided
    d, h = next((d, h) for d, h in decisions if d.variables)
    twin = dataclasses.replace(d, decision_id="f" * 32)  # the same shape's next decision: the same mapping
    a, b = wire_of(d, h, bundle, now=1.7e9), wire_of(twin, h, bundle, now=1.7e9)  # type: ignore[arg-type]
    assert a.variables is b.variables
    copy = dataclasses.replace(d, variables=dict(d.variables))
    c = wire_of(copy, h, bundle, now=1.7e9)  # type: ignore[arg-type]
    assert c.variables is not a.variables and c.variables == a.variables
    for dec, struct in ((d, a), (twin, b), (copy, c)):
        fast = encode_draft(wire_draft(struct))
        assert fast is not None and fast == encode_draft(wire_draft(draft_of(dec, h, bundle, now=1.7e9)))  # type: ignore[arg-type]
