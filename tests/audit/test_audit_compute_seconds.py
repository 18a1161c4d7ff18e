"""Compute seconds apart from GPU-seconds in the accounting records.

A call's `accounting` record holds the model server's measured compute time as
`compute_seconds` (it ran on the CPU here) and no `gpu_seconds`: GPU time is NVML's to
measure, never the compute time relabelled. Logs written before the field existed carried
the compute time as `gpu_seconds`; `data/accounting-before-compute-seconds.db` is such a
log, written by the policyc of commit 4ef2d24 (its `AuditLog` and its
`gateway.access_log.accounting_record`: two calls, the second broken and retried on the
backup). It still verifies, its figures report as compute time, and the new code appends to
it and the whole chain still verifies.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from policyc.audit.accounting import call_accounting, measured
from policyc.audit.log import AuditLog
from policyc.audit.query import AuditReader
from policyc.audit.render import explain_text, report_table
from policyc.audit.verify import verify
from policyc.gateway.access_log import COMPUTE_METHOD, GPU_ABSENT, Attempt, Call, accounting_record

OLD_LOG = Path(__file__).parent / "data" / "accounting-before-compute-seconds.db"
OLD_COMPUTE = 0.000412 + 0.000250  # what the old log's two calls measured (the broken attempt computed nothing)
OLD_NET = (700 + 900) + (700 + 0) + (700 + 600)


@pytest.fixture
def old_log(tmp_path: Path) -> Path:
    p = tmp_path / "old.db"
    shutil.copy(OLD_LOG, p)
    return p


def test_a_log_from_before_compute_seconds_verifies_and_reports_compute_not_gpu_time(old_log: Path) -> None:
    assert verify(old_log).ok
    with AuditReader.open(old_log) as reader:
        [acc] = [e.record for e in reader.actions_for("old-1") if e.record.kind == "accounting"]  # type: ignore[union-attr]
        report = reader.report(by="model")
        text = explain_text(reader.explain("old-1"))  # type: ignore[arg-type]
    # the stored record is the old shape: compute time under gpu_seconds, no compute_seconds
    assert acc.resources.compute_seconds is None and acc.resources.gpu_seconds.method.startswith("model server compute time (")  # type: ignore[union-attr]
    total = report.total
    assert total.compute_seconds_measured == pytest.approx(OLD_COMPUTE)
    assert total.gpu_seconds_measured == 0  # it never was GPU time
    assert total.network_bytes_measured == OLD_NET
    # the broken-and-retried call shows both attempts
    attempts = json.loads(acc.detail)["attempts"]  # type: ignore[union-attr]
    assert [a["compute_seconds"] for a in attempts] == [None, 0.00025] and attempts[0]["host"] != attempts[1]["host"]
    assert "accounting" in text and "network: 2000 bytes, measured" in text


def test_a_new_accounting_record_carries_compute_seconds_and_no_gpu_seconds(old_log: Path) -> None:
    ok = Attempt(host="127.0.0.1:41001", instance="fraud-scorer@h0/gpu0", sent=650, received=910, duration=0.003,
                 first_byte=0.002, status=200, grpc_status="0", compute_seconds=0.000390, flags="")
    rec = accounting_record(Call("old-0", 1764590100.0, 800, 1000, 0.004, 0.003, 1, "0", False), [ok])
    assert rec.resources is not None and rec.resources.gpu_seconds is None
    c = rec.resources.compute_seconds
    assert c is not None and c.source.value == "measured" and c.method == COMPUTE_METHOD and c.value == 0.000390
    assert json.loads(rec.detail)["gpu_seconds"] == GPU_ABSENT  # why it is absent, in the record
    with AuditLog.open(old_log, durability="normal") as log:  # the new code appends to the old log
        log.submit_action(rec).wait()
    with AuditReader.open(old_log) as reader:
        body = json.loads(reader.actions_for("old-0")[-1].record.model_dump_json(exclude_none=True))
        report = reader.report(by="model")
    assert "compute_seconds" in body["resources"] and "gpu_seconds" not in body["resources"]
    assert report.total.compute_seconds_measured == pytest.approx(OLD_COMPUTE + 0.000390)  # old and new, counted alike
    assert report.total.gpu_seconds_measured == 0
    assert verify(old_log).ok
    table = report_table(report)
    head, row = table.splitlines()[1], table.splitlines()[3]
    col = head.split().index("compute_s_meas")
    assert float(row.split()[col]) == pytest.approx(OLD_COMPUTE + 0.000390, rel=1e-2)


def test_nvml_gpu_time_is_kept_apart_and_an_estimate_is_refused() -> None:
    rec = call_accounting("d-1", 1.0, network_bytes=10.0, network_method="envoy", compute_seconds=0.002, compute_method="model server",
                          target="h", detail="{}", gpu_seconds=measured(0.0015, "nvml: per-process SM utilisation x call time"))
    assert rec.resources is not None and rec.resources.gpu_seconds is not None and rec.resources.compute_seconds is not None
    assert (rec.resources.gpu_seconds.value, rec.resources.compute_seconds.value) == (0.0015, 0.002)
    from policyc.audit.records import Figure, Source
    with pytest.raises(ValueError, match="measured GPU time only"):
        call_accounting("d-2", 1.0, network_bytes=10.0, network_method="envoy", compute_seconds=None, compute_method="m",
                        target="h", detail="{}", gpu_seconds=Figure(value=1.0, source=Source.ESTIMATED, method="contract"))


def test_the_html_report_shows_measured_compute_seconds(old_log: Path) -> None:
    from policyc.audit.html_report import html_report

    page = html_report(str(old_log), verify(old_log))
    head = page[page.index("<thead>"):page.index("</thead>")]
    assert "<th>compute s meas</th>" in head
    total = page[page.index('<tr class="total">'):]
    assert f"<td>{OLD_COMPUTE:.3g}</td>" in total  # the old log's compute time, under its own name
