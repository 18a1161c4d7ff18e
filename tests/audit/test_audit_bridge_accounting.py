"""The gateway's per-call accounting records go through the server bridge (`accounting`):
handed over with the decisions of the same batch, so the writer stores both in one commit;
each stored body is exactly what `AuditLog.submit_action` stores; a closed bridge refuses
them (the access-log receiver counts them dropped) rather than leaving them unsent."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from policyc.audit.errors import AuditWriteError
from policyc.audit.log import AuditLog, Receipt
from policyc.audit.records import ActionRecord
from policyc.audit.verify import verify
from policyc.compiler.bundle import Bundle
from policyc.gateway.access_log import Attempt, Call, accounting_record
from policyc.server.audit_bridge import AuditBridge, wire_of
from policyc.server.decision import Decision

from example_decisions import decide_examples

REQUESTS = [{"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"}, {"X-Tenant": "charite", "X-Data-Region": "eu-west"}]


@pytest.fixture(scope="module")
def decided() -> tuple[list[tuple[Decision, dict[str, str]]], Bundle]:
    return decide_examples(REQUESTS, 3)


def _records(decisions: list[tuple[Decision, dict[str, str]]]) -> list[ActionRecord]:
    """One call's record per decision, as the access-log receiver builds it (a retried call: two attempts)."""
    out = []
    for i, (d, _) in enumerate(decisions):
        call = Call(decision_id=d.decision_id, start=1.7e9 + i, received=310 + i, sent=260, duration=0.0045, first_byte=0.004,
                    attempts=2 if i % 2 else 1, grpc_status="0", tls=False, upstream_host="127.0.0.1:4100", instance="inst-1")
        attempts = [Attempt(host=f"127.0.0.1:41{k:02d}", instance="inst-1", sent=300, received=250 + k, duration=0.004,
                            first_byte=0.0039, status=200 if k == call.attempts - 1 else 0, grpc_status="0", compute_seconds=0.0008,
                            flags="" if k == call.attempts - 1 else "upstream_reset") for k in range(call.attempts)]
        out.append(accounting_record(call, attempts))
    return out


def _bodies(path: Path) -> list[bytes]:
    with sqlite3.connect(path) as c:
        return [r[0] for r in c.execute("SELECT body FROM entries ORDER BY seq")]


def test_drafts_and_bodies_of_one_hand_over_share_one_commit(decided: tuple[list[tuple[Decision, dict[str, str]]], Bundle],
                                                             tmp_path: Path) -> None:
    decisions, bundle = decided
    records = _records(decisions)
    bodies = [r.model_dump_json(exclude_none=True).encode() for r in records]
    with AuditLog.open(tmp_path / "one.db") as log:
        before = log.commits
        first = log.submit_decision_drafts([wire_of(d, h, bundle, now=1.7e9) for d, h in decisions], bodies)
        Receipt(log, first + len(decisions) + len(bodies) - 1).wait(timeout=10)
        assert log.commits == before + 1
    stored = _bodies(tmp_path / "one.db")
    assert len(stored) == 2 * len(decisions) and stored[len(decisions):] == bodies
    assert verify(tmp_path / "one.db").ok


def test_bridge_accounting_stores_what_submit_action_stores(decided: tuple[list[tuple[Decision, dict[str, str]]], Bundle],
                                                            tmp_path: Path) -> None:
    decisions, bundle = decided
    records = _records(decisions)
    with AuditLog.open(tmp_path / "direct.db") as log:
        for r in records:
            log.submit_action(r)
    with AuditLog.open(tmp_path / "bridge.db") as log:
        bridge = AuditBridge(log, bundle)
        for (d, h), r in zip(decisions, records):
            bridge.decision(d, h)
            bridge.accounting(r)
        bridge.close()
        assert bridge.failures == 0
        with pytest.raises(AuditWriteError, match="closed"):
            bridge.accounting(records[0])
    stored = _bodies(tmp_path / "bridge.db")
    accounting = [b for b in stored if b'"kind":"accounting"' in b]
    assert accounting == _bodies(tmp_path / "direct.db") and len(stored) == 2 * len(decisions)
    report = verify(tmp_path / "bridge.db")
    assert report.ok and report.entries == 2 * len(decisions)


def test_bridge_refuses_what_is_not_an_action_record(decided: tuple[list[tuple[Decision, dict[str, str]]], Bundle],
                                                    tmp_path: Path) -> None:
    _, bundle = decided
    with AuditLog.open(tmp_path / "t.db") as log:
        bridge = AuditBridge(log, bundle)
        with pytest.raises(TypeError, match="ActionRecord"):
            bridge.accounting({"kind": "accounting"})  # type: ignore[arg-type]
        bridge.close()
