"""Accounting honesty (issue 40): every figure says its kind (measured / apportioned /
estimated) and its source; nothing estimated is shown or summed as measured; `explain`
prints each quantity once, the evidence first and the contract's estimate beside it,
labelled, never in its place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audit_helpers import decision

from policyc.audit import export as ex
from policyc.audit.accounting import call_accounting, call_accounting_body, measured
from policyc.audit.log import AuditLog
from policyc.audit.query import AuditReader
from policyc.audit.records import Figure, Source
from policyc.audit.render import explain_text

CGROUP_RULE = "cgroup cpu.stat usage of the serving process over the call, apportioned by overlap across 3 concurrent calls"


def _accounting(did: str, *, kind: Source = Source.MEASURED, gpu: Figure | None = None) -> bytes:
    rec = call_accounting(did, 1777593600.5, network_bytes=2000, network_method="envoy access log (upstream bytes)",
                          compute_seconds=0.004, compute_method=CGROUP_RULE if kind is Source.APPORTIONED else "model server",
                          target="fraud-scorer@h0/gpu0", detail="{}", gpu_seconds=gpu, compute_kind=kind)
    return rec.model_dump_json(exclude_none=True).encode()


def test_apportioned_compute_has_its_kind_and_the_fast_body_is_the_same_bytes() -> None:
    body = _accounting("d1", kind=Source.APPORTIONED)
    fast = call_accounting_body("d1", 1777593600.5, network_bytes=2000, network_method="envoy access log (upstream bytes)",
                                compute_seconds=0.004, compute_method=CGROUP_RULE, target="fraud-scorer@h0/gpu0", detail="{}",
                                compute_kind=Source.APPORTIONED)
    assert fast == body
    assert json.loads(body)["resources"]["compute_seconds"] == {"value": 0.004, "source": "apportioned", "method": CGROUP_RULE}
    with pytest.raises(ValueError, match="not an estimate"):
        call_accounting_body("d1", 1.0, network_bytes=1, network_method="m", compute_seconds=1.0, compute_method="contract",
                             target="t", detail="", compute_kind=Source.ESTIMATED)
    est = Figure(value=0.01, source=Source.ESTIMATED, method="contract")
    with pytest.raises(ValueError, match="measured GPU time only"):
        _accounting("d1", gpu=est)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.db"
    with AuditLog.open(path, durability="normal") as log:
        log.append_decision(decision(1, t=1777593600.0))  # the contract's GPU estimate
        log.submit_body(_accounting("dec-000001", gpu=measured(0.0123, "nvml per-process accounting"))).wait()
        log.append_decision(decision(2, t=1777593601.0))
        log.submit_body(_accounting("dec-000002", kind=Source.APPORTIONED)).wait()
        log.append_decision(decision(3, t=1777593602.0))  # no accounting: the estimate alone
    return path


def test_explain_prints_each_quantity_once_evidence_first(log: Path) -> None:
    with AuditReader.open(log) as reader:
        measured_gpu = explain_text(reader.explain("dec-000001"))  # type: ignore[arg-type]
        apportioned = explain_text(reader.explain("dec-000002"))  # type: ignore[arg-type]
        estimate_only = explain_text(reader.explain("dec-000003"))  # type: ignore[arg-type]
    for text in (measured_gpu, apportioned, estimate_only):
        assert text.count("GPU time") == 1, text
        assert text.count("network:") == 1, text
    line = next(ln for ln in measured_gpu.splitlines() if "GPU time" in ln)
    assert "0.0123 GPU-s, measured by nvml per-process accounting" in line
    assert "not counted as evidence: estimated 0.0096" in line  # the contract's figure, labelled
    compute = next(ln for ln in apportioned.splitlines() if "compute:" in ln)
    assert "0.004 s, apportioned by " + CGROUP_RULE in compute
    gpu = next(ln for ln in estimate_only.splitlines() if "GPU time" in ln)
    assert "estimated by contract" in gpu and "measured" not in gpu


def test_report_and_export_keep_the_kinds_apart(log: Path, tmp_path: Path) -> None:
    with AuditReader.open(log) as reader:
        total = reader.report(by="model").total
    assert total.gpu_seconds_measured == pytest.approx(0.0123)
    assert total.gpu_seconds_estimated == pytest.approx(3 * 0.0096)
    assert total.compute_seconds_measured == pytest.approx(0.004) and total.compute_seconds_apportioned == pytest.approx(0.004)
    ex.export(log, "jsonl", tmp_path / "x.jsonl")
    rows = list(ex.read(tmp_path / "x.jsonl"))
    kinds = {r["compute_seconds_kind"] for r in rows if r["kind"] == "action"}
    assert kinds == {"measured", "apportioned"}
    # every figure of every record carries a kind from the closed list and a source
    for r in rows:
        for f in ex.FIGURES:
            if r[f] is not None:
                assert r[f"{f}_kind"] in {s.value for s in Source} and r[f"{f}_source"], (r["seq"], f)


def test_an_llm_calls_figures_get_their_columns_with_kind_and_source(tmp_path: Path) -> None:
    """Figures added in a group of their own (an LLM call's `llm`) are exported without a
    change to the export: value, kind and source columns each, and explain shows them once."""
    from policyc.audit.records import ActionRecord, LlmFigures

    path = tmp_path / "audit.db"
    rec = ActionRecord.model_validate_json(_accounting("dec-000001"))
    llm = LlmFigures(prompt_tokens=measured(812, "gateway count (model tokenizer)"),
                     ttft_seconds=measured(0.021, "gateway: first SSE byte"),
                     flops=Figure(value=1.3e12, source=Source.ESTIMATED, method="contract per-token FLOPs x tokens"))
    with AuditLog.open(path, durability="normal") as log:
        log.append_decision(decision(1, t=1777593600.0))
        log.append_action(rec.model_copy(update={"llm": llm}))
    ex.export(path, "csv", tmp_path / "x.csv")
    act = next(r for r in ex.read(tmp_path / "x.csv") if r["kind"] == "action")
    assert (act["llm_prompt_tokens"], act["llm_prompt_tokens_kind"], act["llm_prompt_tokens_source"]) == \
        (812.0, "measured", "gateway count (model tokenizer)")
    assert act["llm_flops_kind"] == "estimated" and act["llm_completion_tokens"] is None
    with AuditReader.open(path) as reader:
        text = explain_text(reader.explain("dec-000001"))  # type: ignore[arg-type]
    assert text.count("llm prompt tokens: 812, measured by gateway count") == 1, text
