"""The shipped examples: every broken policy yields its diagnostic with the conflicting
clauses' spans, the real policies are clean, and `policyc diff` gates the versions."""

from __future__ import annotations

import json

import pytest

from policyc.cli.main import main
from policyc.compiler import bundle_io
from policyc.compiler.pipeline import compile_paths
from policyc.solver.feasibility import Feasible, Infeasible, RequestFeasibility

BASE = ["policies/gpu-catalog.contract", "policies/requests.contract", "policies/fraud-scorer.contract",
        "policies/recommender.contract"]


def codes(result, code):
    return [d for d in result.diagnostics if d.code == code]


def test_real_policies_are_clean_and_carry_gpu_shares() -> None:
    r = compile_paths(["policies"])
    assert r.ok and not r.diagnostics
    shares = {s.gpu: s for s in r.bundle.contract("recommender").gpu_shares}
    assert shares["L4"].feasible is False and shares["L4"].binding == "bandwidth"
    fraud = {s.gpu: s for s in r.bundle.contract("fraud-scorer").gpu_shares}
    # the served model's 4.2e7 FLOPs need almost none of an A100-80G in 180 ms: its 80 GB/s of
    # the card's 2039 GB/s binds (3.9 %)
    a100 = fraud["A100-80G"]
    assert a100.feasible and a100.binding == "bandwidth" and a100.min_share == pytest.approx(80 / 2039)


def test_infeasible_contracts_name_their_conflicting_lines() -> None:
    r = compile_paths(["policies/gpu-catalog.contract", "policies/broken/infeasible-contracts.contract"])
    errs = {d.message.split("`")[1]: d for d in codes(r, "E501")}
    assert set(errs) == {"no-time-left", "bandwidth-hog", "too-fast"}
    lines = lambda d: sorted(n.span.line for n in d.notes if n.span)  # noqa: E731
    assert lines(errs["no-time-left"]) == [8, 8]  # latency and allowance, on one line
    assert lines(errs["bandwidth-hog"]) == [30]
    assert lines(errs["too-fast"]) == [43, 46, 60, 61, 65]  # flops, efficiency, latency, allowance, arch
    assert all(n.span.file.endswith("infeasible-contracts.contract") for d in errs.values() for n in d.notes)


def test_contradictory_rules_are_errors_with_cores() -> None:
    r = compile_paths(BASE + ["policies/broken/contradictory-rules.contract"])
    errs = {d.message.split("`")[1]: d for d in codes(r, "E502")}
    assert set(errs) == {"contradictions.two-regions", "contradictions.impossible-guard", "contradictions.below-every-slo"}
    assert sorted((n.span.line, n.span.col) for n in errs["contradictions.two-regions"].notes) == [(8, 14), (8, 36)]
    assert r.bundle is None


def test_shadowed_rules_are_warnings_naming_both_rules() -> None:
    r = compile_paths(BASE + ["policies/broken/shadowed-rules.contract"])
    warns = codes(r, "W501")
    assert sorted(w.message for w in warns) == [
        "rule `hardening.acme-encrypted` is shadowed by rule `hardening.finance-full`",
        "rule `hardening.finance-tpm` is shadowed by rule `hardening.finance-full`",
    ]
    assert r.ok and {w.code for w in r.bundle.warnings} == {"W501"}


def test_request_feasibility_on_the_real_policies() -> None:
    f = RequestFeasibility(compile_paths(["policies"]).bundle)
    assert isinstance(f.check({"tenant": "acme-bank", "region": "us-west"}), Feasible)
    mars = f.check({"tenant": "acme-bank", "region": "mars-1"})
    assert isinstance(mars, Infeasible) and "mars-1" in mars.reason and mars.spans
    fast = f.check({"tenant": "shopwave", "slo": 0.002})
    assert isinstance(fast, Infeasible) and fast.rule_ids == ("routing.latency-target",)
    healthcare_us = f.check({"tenant": "st-marys", "region": "us-west"})
    assert isinstance(healthcare_us, Infeasible)
    assert set(healthcare_us.rule_ids) == {"routing.data-region", "compliance.healthcare-eu"}


def test_diff_cli_exit_codes(tmp_path, capsys) -> None:
    assert main(["diff", "policies/versions/v1", "policies/versions/v2"]) == 3
    out = capsys.readouterr().out
    assert "compliance widened: hardware_firewall" in out and "fleet.contract:" in out and "tenant=acme-bank" in out
    assert main(["diff", "policies/versions/v2", "policies/versions/v1", "--format", "json"]) == 4
    doc = json.loads(capsys.readouterr().out)
    assert doc["differences"][0]["direction"] == "narrowed" and doc["exit_code"] == 4
    bundle_file = tmp_path / "v1.json"
    bundle_io.write(compile_paths(["policies/versions/v1"]).bundle, bundle_file)
    assert main(["diff", str(bundle_file), "policies/versions/v1"]) == 0
    assert "equivalent" in capsys.readouterr().out


def test_diff_cli_bad_input_is_a_message_not_a_traceback(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["diff", str(bad), "policies/versions/v1"]) == 1
    err = capsys.readouterr().err
    assert "not a bundle" in err and "Traceback" not in err
    assert main(["diff", "policies/broken", "policies/versions/v1"]) == 1
    assert "error[E" in capsys.readouterr().err
