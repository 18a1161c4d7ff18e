"""A rejected decision's record names the rules that refused it (`rejected_by`), each with
its source line, for every rejection kind; the three ways the server builds a record store
the same bytes; the HTML report groups rejections by those rule ids, the export and
`explain` show them; admitted records keep their bytes (no `rejected_by` key)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from policyc.audit.draft_encoder import encode_draft, wire_draft
from policyc.audit.export import export, read
from policyc.audit.html_report import gather, html_report
from policyc.audit.log import AuditLog
from policyc.audit.query import AuditReader
from policyc.audit.render import explain_text
from policyc.audit.verify import verify
from policyc.server.audit_bridge import decision_record, draft_of, wire_of
from policyc.server.decision import Decision, Rejection, Stage

from example_decisions import decide_examples

ROUTING = "policies/routing.contract"
REQUESTS = [
    {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"},  # admitted
    {"X-Tenant": "charite", "X-Data-Region": "eu-west"},  # match: the applied rules exclude every live instance
    {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer", "X-Data-Region": "eu-west"},  # feasibility: Z3's unsat core
    {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer", "X-SLO-Latency": "1ms"},  # feasibility: one rule
]


@pytest.fixture(scope="module")
def decided() -> tuple[list[tuple[Decision, dict[str, str]]], object]:
    decisions, bundle = decide_examples(REQUESTS, 1)
    # the kinds the example fleet does not give on its own, on the same decisions' parts
    refused = decisions[3][0]
    placement = dataclasses.replace(refused, model="fraud-scorer", decision_id=refused.decision_id + "-p",
                                    rejection=Rejection(Stage.PLACEMENT, "`fraud-scorer`: no GPU has the share", binding="gpu_share"))
    domain_span = bundle.contract("fraud-scorer").origin  # type: ignore[attr-defined]
    domain = dataclasses.replace(refused, decision_id=refused.decision_id + "-d", rejection=Rejection(Stage.FEASIBILITY, "`request.x` is outside the range", (), (domain_span,)))
    unroutable = dataclasses.replace(refused, decision_id=refused.decision_id + "-u", rejection=Rejection(Stage.MATCH, "none of the 3 admissible instances has an endpoint"))
    extra = [(placement, {}), (domain, {}), (unroutable, {})]
    return decisions + extra, bundle  # type: ignore[return-value]


def _bodies(decided, tmp_path: Path) -> list[dict]:  # type: ignore[no-untyped-def]
    decisions, bundle = decided
    with AuditLog.open(tmp_path / "log.db") as log:
        log.submit_decision_drafts([wire_of(d, h, bundle, now=1.7e9) for d, h in decisions])
    assert verify(tmp_path / "log.db").ok
    with sqlite3.connect(tmp_path / "log.db") as c:
        return [json.loads(r[0]) for r in c.execute("SELECT body FROM entries WHERE kind = 'decision' ORDER BY seq")]


def test_every_rejection_kind_names_what_refused_it(decided, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bodies = _bodies(decided, tmp_path)
    admitted, match, core, one, placement, domain, unroutable = bodies
    assert admitted["outcome"] == "admitted" and "rejected_by" not in admitted
    for b in bodies[1:]:
        assert b["outcome"] == "rejected" and b["rejected_by"], b
    assert {r["id"] for r in match["rejected_by"]} == {"routing.data-region", "compliance.healthcare-eu"}
    assert all(r["stage"] == "match" and r["origin"]["file"] == ROUTING for r in match["rejected_by"])
    assert [r["id"] for r in core["rejected_by"]] == ["routing.pinned-model", "routing.data-region"]
    assert one["rejected_by"] == [{"stage": "feasibility", "id": "routing.latency-target",
                                   "origin": {"file": ROUTING, "line": 10, "col": 3, "end_line": 13, "end_col": 4}}]
    # a rule id is named in the reason too: the record's ids are the rejection's, not a guess from its text
    assert "`routing.latency-target`" in one["reason"]
    assert placement["rejected_by"][0]["id"] == "placement:gpu_share" and placement["rejected_by"][0]["origin"]["file"].endswith(
        "fraud-scorer.contract")
    assert domain["rejected_by"][0]["id"] == "feasibility" and "origin" in domain["rejected_by"][0]
    assert unroutable["rejected_by"] == [{"stage": "match", "id": "match"}]  # no rule refused it, and the record says so


def test_the_three_builders_store_the_same_bytes(decided) -> None:  # type: ignore[no-untyped-def]
    decisions, bundle = decided
    for d, h in decisions:
        fast = encode_draft(wire_draft(wire_of(d, h, bundle, now=1.7e9)))
        plain = encode_draft(wire_draft(draft_of(d, h, bundle, now=1.7e9)))
        assert fast is not None and fast == plain
        model = decision_record(d, h, bundle).model_copy(update={"time": 1.7e9})
        assert fast.body == model.model_dump_json(exclude_none=True).encode()


def test_report_export_and_explain_show_the_rule_ids(decided, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bodies = _bodies(decided, tmp_path)
    db = tmp_path / "log.db"
    page = gather(str(db), verify(db))
    groups = {(g.rule, g.where): g.count for g in page.rules}
    assert groups[("routing.latency-target", f"{ROUTING}:10")] == 1
    assert groups[("routing.data-region", f"{ROUTING}:15")] == 2  # the match and the unsat core both name it
    assert ("match", "") in groups and any(r.startswith("placement:gpu_share") for r, _ in groups)
    page_html = html_report(str(db), verify(db))
    assert "routing.latency-target" in page_html and f"{ROUTING}:10" in page_html and "placement:gpu_share" in page_html
    for fmt in ("jsonl", "csv"):
        out = tmp_path / f"x.{fmt}"
        export(db, fmt, out)
        rows = {r["decision_id"]: r for r in read(out)}
        one = bodies[3]["decision_id"]
        assert rows[one]["rejected_by"] == f"routing.latency-target ({ROUTING}:10)", fmt
        assert rows[bodies[0]["decision_id"]]["rejected_by"] is None
    with AuditReader.open(db) as reader:
        ex = reader.explain(bodies[2]["decision_id"])
    assert ex is not None
    text = explain_text(ex)
    assert "rejected by:" in text and f"routing.pinned-model (feasibility)  at {ROUTING}:5" in text
