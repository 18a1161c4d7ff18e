"""The writer process: drafts store the same bytes as records, a bad draft is refused on its
receipt without breaking the chain, and a writer that dies is reported, never waited on."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import pytest
from audit_helpers import decision

from policyc.audit.errors import AuditWriteError
from policyc.audit.log import AuditLog, Receipt
from policyc.audit.redaction import DEFAULT_REDACT, Redactor
from policyc.audit.verify import verify


def _bodies(db: Path) -> list[bytes]:
    with sqlite3.connect(db) as c:
        return [r[0] for r in c.execute("SELECT body FROM entries ORDER BY seq")]


def test_draft_stores_the_bytes_the_record_would(tmp_path: Path) -> None:
    records = [decision(i) for i in range(12)]
    with AuditLog.open(tmp_path / "rec.db") as log:
        seqs = [log.append_decision(r) for r in records]
    with AuditLog.open(tmp_path / "draft.db") as log:
        receipts = [log.submit_decision_draft(r.model_dump(mode="json")) for r in records]  # type: ignore[arg-type]
        assert [r.wait() for r in receipts] == seqs == list(range(1, 13))
    assert _bodies(tmp_path / "draft.db") == _bodies(tmp_path / "rec.db")
    assert all(b"tok-" not in b and b"[REDACTED]" in b for b in _bodies(tmp_path / "draft.db"))  # redacted in the writer
    assert verify(tmp_path / "draft.db").ok


def test_bad_draft_is_refused_on_its_receipt_and_the_chain_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditLog.open(db) as log:
        good = log.submit_decision_draft(decision(1).model_dump(mode="json"))  # type: ignore[arg-type]
        bad_draft = decision(2).model_dump(mode="json")
        bad_draft["outcome"] = "maybe"
        bad = log.submit_decision_draft(bad_draft)  # type: ignore[arg-type]
        after = log.submit_decision(decision(3))
        assert good.wait() == 1
        with pytest.raises(AuditWriteError, match=r"dec-000002.*outcome"):
            bad.wait()
        assert after.wait() == 2  # the refused draft takes no seq
        assert log.failures == 1
        assert log.append_decision(decision(4)) == 3
    report = verify(db)
    assert report.ok and report.entries == 3


def test_draft_of_unsupported_values_is_a_type_error_at_the_call(tmp_path: Path) -> None:
    with AuditLog.open(tmp_path / "audit.db") as log:
        with pytest.raises(TypeError, match="only dicts, lists"):
            log.submit_decision_draft({"decision_id": "x", "time": object()})  # type: ignore[typeddict-item]
        with pytest.raises(TypeError, match="DecisionDraft"):
            log.submit_decision_draft(decision(1))  # type: ignore[arg-type]


def test_dead_writer_is_reported_not_waited_on(tmp_path: Path) -> None:
    log = AuditLog.open(tmp_path / "audit.db")
    try:
        assert log.append_decision(decision(1)) == 1
        os.kill(log._proc.pid, signal.SIGKILL)
        log._proc.wait()
        with pytest.raises(AuditWriteError, match="not stored|gone|stopped"):
            for i in range(1000):  # the ack reader notices the end of the pipe promptly
                log.submit_decision(decision(i)).wait(timeout=10)
    finally:
        log.close()
    assert verify(tmp_path / "audit.db").ok


def test_bulk_bodies_and_checkpoint_on_request(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    body = decision(7).model_dump_json(exclude_none=True).encode()
    with AuditLog.open(db, checkpoint_every=1_000_000) as log:
        receipts = log.submit_bodies([body] * 50)
        assert [r.wait() for r in receipts] == list(range(1, 51))
        log.checkpoint()
        log.append_decision(decision(8))
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM checkpoints").fetchone()[0] >= 2  # requested + final
    assert verify(db).ok


def test_body_that_is_not_json_is_refused_alone(tmp_path: Path) -> None:
    """Store v2 derives every entry's index columns from its body: a body that is not JSON
    has none, so it is refused on its own receipt and the records around it are stored."""
    db = tmp_path / "audit.db"
    good = decision(1).model_dump_json(exclude_none=True).encode()
    with AuditLog.open(db) as log:
        receipts = log.submit_bodies([good, b"{not json", good])
        assert receipts[0].wait() == 1
        with pytest.raises(AuditWriteError, match="not JSON"):
            receipts[1].wait()
        assert receipts[2].wait() == 2
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT tenant, gpu_s FROM entries WHERE seq = 2").fetchone() == ("globex", 0.0096)
    assert verify(db).ok


def test_batch_of_drafts_is_one_hand_over_and_all_or_nothing_at_the_call(tmp_path: Path) -> None:
    drafts = [decision(i).model_dump(mode="json") for i in range(5)]
    with AuditLog.open(tmp_path / "audit.db") as log:
        first = log.submit_decision_drafts(drafts)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="only dicts"):
            log.submit_decision_drafts([drafts[0], {"decision_id": "x", "time": object()}])  # type: ignore[list-item]
        assert log.append_decision(decision(9)) == 6  # the refused batch took no ticket
        assert first == 0
    assert verify(tmp_path / "audit.db").ok


def test_batch_stores_the_bytes_the_records_would_and_refuses_only_its_bad_draft(tmp_path: Path) -> None:
    """A DRAFTS frame: all fast (with secrets to redact), or one draft needing pydantic's
    coercion and one it refuses, which alone fails; the others keep their order."""
    records = [decision(i) for i in range(6)]
    with AuditLog.open(tmp_path / "rec.db") as log:
        for r in records:
            log.append_decision(r)
        log.append_decision(records[0])
    drafts = [r.model_dump(mode="json") for r in records]
    coerced = dict(drafts[3], time=int(drafts[3]["time"]))  # an int where a float is declared
    bad = dict(drafts[4], outcome="maybe")
    with AuditLog.open(tmp_path / "draft.db") as log:
        first = log.submit_decision_drafts(drafts)  # type: ignore[arg-type]
        second = log.submit_decision_drafts([drafts[0], coerced, bad])  # type: ignore[list-item]
        assert (first, second) == (0, 6)
        log.append_decision(records[5])
        with pytest.raises(AuditWriteError, match=r"dec-000004.*outcome"):
            Receipt(log, second + 2).wait()
        assert Receipt(log, second + 1).wait() == 8
        assert log.failures == 1
    stored = _bodies(tmp_path / "draft.db")
    want = _bodies(tmp_path / "rec.db")
    assert stored[:7] == want[:7]  # the batch of six, then drafts[0] again
    coerced_record = records[3].model_copy(update={"time": float(int(records[3].time))})
    assert stored[7] == Redactor(DEFAULT_REDACT).dump(coerced_record, coerced_record.request).encode()
    assert all(b"tok-" not in b for b in stored)
    assert verify(tmp_path / "draft.db").ok
