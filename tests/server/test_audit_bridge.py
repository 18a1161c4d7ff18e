"""The audit bridge hands decisions to the log as drafts: the writer process must store the
bytes the validated `DecisionRecord` would have given, for every kind of decision, and a
draft the writer refuses must show up in the bridge's `failures`."""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path
from typing import Iterator

import pytest
from server_rig import SMALL, start

from policyc.audit.log import AuditLog
from policyc.audit.verify import verify
from policyc.compiler.bundle import Bundle
from policyc.server.app import ServerThread
from policyc.server.audit_bridge import AuditBridge, decision_record, draft_of
from policyc.server.config import ServeConfig
from policyc.server.decision import Decision, DecisionInput, Stage


def _bodies(db: Path) -> list[bytes]:
    with sqlite3.connect(db) as c:
        return [r[0] for r in c.execute("SELECT body FROM entries ORDER BY seq")]


@pytest.fixture(scope="module")
def quiet(bundle: Bundle) -> Iterator[ServerThread]:
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    yield th
    th.stop()


def _decisions(th: ServerThread) -> list[tuple[Decision, dict[str, str]]]:
    engine = th.server.engine
    cases = [
        {"X-SLO-Latency": "150ms", "X-Data-Region": "us-west", "Authorization": "Bearer tok-secret-1"},  # admitted
        {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer", "X-Retry-Count": "1"},  # admitted, finance rules
        {"X-Tenant": "st-marys", "X-Data-Region": "us-east"},  # rejected by the solver
        {"X-Tenant": "charite", "X-Model": "clinical-notes"},  # rejected by the matcher
        {"X-Model": "support-chatbot"},
    ]
    out = [(engine.decide(DecisionInput(headers=h, attributes={})), h) for h in cases]
    stages = {d.rejection.stage for d, _ in out if d.rejection is not None}
    assert stages == {Stage.FEASIBILITY, Stage.MATCH} and sum(d.admitted for d, _ in out) == 3
    # a placement refusal: the same admitted decision with its plan taken away and a reason
    d0 = out[0][0]
    rej = dataclasses.replace(out[2][0].rejection, stage=Stage.PLACEMENT, reason="x" * 700)  # type: ignore[arg-type]
    out.append((dataclasses.replace(d0, plan=None, rejection=rej, region=None), out[0][1]))
    return out


def test_drafts_store_the_bytes_the_record_would(quiet: ServerThread, tmp_path: Path) -> None:
    bundle = quiet.server.engine.state.bundle
    decisions = _decisions(quiet)
    records = [decision_record(d, h, bundle) for d, h in decisions]
    assert any(r.resources is not None for r in records) and any(r.placement is None for r in records)
    with AuditLog.open(tmp_path / "rec.db") as log:
        for r in records:
            log.append_decision(r)
    with AuditLog.open(tmp_path / "draft.db") as log:
        receipts = [log.submit_decision_draft(draft_of(d, h, bundle, now=r.time)) for (d, h), r in zip(decisions, records)]
        assert [x.wait() for x in receipts] == list(range(1, len(records) + 1))
    assert _bodies(tmp_path / "draft.db") == _bodies(tmp_path / "rec.db")
    assert not any(b"tok-secret" in b for b in _bodies(tmp_path / "draft.db"))  # redacted by the writer
    assert verify(tmp_path / "draft.db").ok


def test_bridge_records_decisions_and_counts_refused_drafts(quiet: ServerThread, tmp_path: Path) -> None:
    bundle = quiet.server.engine.state.bundle
    decisions = _decisions(quiet)
    with AuditLog.open(tmp_path / "bridge.db") as log:
        bridge = AuditBridge(log, bundle)
        for d, h in decisions:
            bridge.decision(d, h)
        # a decision the schema refuses (empty id): refused by the writer, not at the call
        bad = dataclasses.replace(decisions[0][0], decision_id="")
        bridge.decision(bad, {})
        bridge.close()  # hands over the waiting batch, then closes the log
        assert bridge.failures == 1
    ids = [d.decision_id.encode() for d, _ in decisions]
    bodies = _bodies(tmp_path / "bridge.db")
    assert len(bodies) == len(decisions) and all(i in b for i, b in zip(ids, bodies))


def test_a_quiet_services_last_decisions_reach_the_log_without_close(quiet: ServerThread, tmp_path: Path) -> None:
    bundle = quiet.server.engine.state.bundle
    decisions = _decisions(quiet)[:3]
    with AuditLog.open(tmp_path / "quiet.db") as log:
        bridge = AuditBridge(log, bundle)
        for d, h in decisions:
            bridge.decision(d, h)
        deadline = time.monotonic() + 5.0
        while log.last_seq < len(decisions) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert log.last_seq == len(decisions)  # the bridge's timer handed them over (~50 ms)
        bridge.close()
    assert len(_bodies(tmp_path / "quiet.db")) == len(decisions)


def test_batches_reach_the_log_in_decision_order(quiet: ServerThread, tmp_path: Path) -> None:
    bundle = quiet.server.engine.state.bundle
    engine = quiet.server.engine
    decisions = [engine.decide(DecisionInput(headers={"X-Model": "fraud-scorer-lite"}, attributes={})) for _ in range(100)]
    with AuditLog.open(tmp_path / "order.db") as log:
        bridge = AuditBridge(log, bundle)
        for d in decisions:
            bridge.decision(d, {})
        bridge.close()
    bodies = _bodies(tmp_path / "order.db")
    assert [b.split(b'"decision_id":"', 1)[1].split(b'"', 1)[0] for b in bodies] == [d.decision_id.encode() for d in decisions]
