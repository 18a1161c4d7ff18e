"""Rule analyses, request feasibility and the semantic diff, cross-checked against
brute-force enumeration over small finite domains (see solver_gen.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver_gen import bundle, contracts_st, instances, requests, rules_st

from policyc.solver.diff import Direction, diff_bundles
from policyc.solver.domains import domains
from policyc.solver.feasibility import Feasible, Infeasible, RequestFeasibility
from policyc.solver.rule_check import RuleAnalysis, RuleUnsat
from policyc.compiler.semantics import require_holds, rule_applies
from policyc.solver.semantics import admitted, instance_in_domain, request_in_domain, rules_admit
from policyc.solver.verdict import Verdict

SETTINGS = settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(contracts_st, rules_st)
def test_unsatisfiable_rules_agree_with_brute_force(contracts, rules) -> None:
    b = bundle(contracts, rules)
    dom = domains(b)
    a = RuleAnalysis(b)
    reqs = [r for r in requests() if request_in_domain(dom, r)]
    insts = instances(b)
    for rule in rules:
        res = a.unsat_rule(rule)
        assert res is not Verdict.UNKNOWN
        sat = any(rule_applies(rule, r) and require_holds(rule.require, i, r) for r in reqs for i in insts)
        assert (res is None) == sat, f"{rule.id}: z3 says {res}, brute force says sat={sat}"
        if isinstance(res, RuleUnsat):
            assert res.core, "an unsatisfiable rule names its conflicting conditions"
            if res.guard_only:
                assert not any(rule_applies(rule, r) for r in reqs)


@SETTINGS
@given(contracts_st, rules_st)
def test_shadowing_agrees_with_brute_force(contracts, rules) -> None:
    b = bundle(contracts, rules)
    dom = domains(b)
    a = RuleAnalysis(b)
    reqs = [r for r in requests() if request_in_domain(dom, r)]
    insts = instances(b)
    for r_rule in rules:
        for s_rule in rules:
            if r_rule is s_rule:
                continue
            z = a.subsumes(s_rule, r_rule)
            counter = any(rule_applies(r_rule, q) and (not rule_applies(s_rule, q) or (require_holds(s_rule.require, i, q) and not require_holds(r_rule.require, i, q)))
                          for q in reqs for i in insts)
            assert (z is Verdict.UNSAT) == (not counter)
            if z is Verdict.UNSAT:  # shadowed really means: dropping it changes no decision
                rest = tuple(x for x in rules if x is not r_rule)
                assert all(rules_admit(rules, q, i) == rules_admit(rest, q, i) for q in reqs for i in insts)


@SETTINGS
@given(contracts_st, rules_st)
def test_request_feasibility_agrees_with_brute_force(contracts, rules) -> None:
    b = bundle(contracts, rules)
    dom = domains(b)
    f = RequestFeasibility(b)
    insts = instances(b)
    for q in requests():
        answer = f.check(q)
        again = f.check(q)
        assert answer == again
        if not request_in_domain(dom, q):
            assert isinstance(answer, Infeasible)
            continue
        brute = any(admitted(b, dom, q, i) for i in insts)
        assert isinstance(answer, Feasible) == brute, f"{q}: {answer}"
        if isinstance(answer, Infeasible):
            blamed = tuple(r for r in rules if r.id in answer.rule_ids)
            assert blamed and not any(rules_admit(blamed, q, i) for i in insts), "the named rules really conflict"


@SETTINGS
@given(contracts_st, rules_st, rules_st, st.booleans())
def test_diff_witnesses_really_differ_and_equivalence_is_exact(contracts, old_rules, new_rules, same_rules) -> None:
    old = bundle(contracts, old_rules)
    new = bundle(contracts, old_rules if same_rules else new_rules)
    report = diff_bundles(old, new, limit=5)
    assert not report.undecided
    d_old, d_new = domains(old), domains(new)
    for d in report.differences:
        a_old = admitted(old, d_old, d.request, d.instance)
        a_new = admitted(new, d_new, d.request, d.instance)
        assert a_old != a_new, f"witness does not differ: {d}"
        assert (d.direction is Direction.WIDENED) == a_new
        if d.compliance:
            assert d.direction is Direction.WIDENED
            attr = d.compliance[0]
            want = d.instance.get(attr)
            assert want is False or attr == "region"
            # OLD serves this request on no instance with that attribute value
            assert not any(admitted(old, d_old, d.request, i) and i.get(attr) == want for i in instances(old))
    brute_differs = any(
        admitted(old, d_old, q, i) != admitted(new, d_new, q, i)
        for q in requests() for i in instances(old) if instance_in_domain(old, d_old, i))
    if brute_differs:
        assert report.differences, "brute force finds a difference the solver missed"
    if same_rules:
        assert report.exit_code == 0
