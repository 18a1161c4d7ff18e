"""Instance classes encode exactly the union of their members' domains, and the diff
over classes still sees a contract changed on one side only."""

from __future__ import annotations

import random

import z3

from solver_gen import bundle, contract

from policyc.compiler.bundle import Atom, Const, RequestRule, Slo, SourceRef, Var
from policyc.solver.classes import group
from policyc.solver.diff import Direction, diff_bundles
from policyc.solver.domains import domains
from policyc.solver.encode import RuleEncoder
from policyc.solver.semantics import admitted
from policyc.solver.space import Space
from policyc.solver.verdict import Verdict, new_solver, verdict

REF = SourceRef(file="gen.contract", line=1, col=1)
RULES = (
    RequestRule(id="p.latency", policy="p", require=Atom(attr="slo_latency", cmp="<=", operand=Var(name="slo"), origin=REF), origin=REF),
    RequestRule(id="p.region", policy="p", require=Atom(attr="region", cmp="==", operand=Var(name="region"), origin=REF), origin=REF),
    RequestRule(id="p.no-phi", policy="p", require=Atom(attr="labels.data", cmp="!=", operand=Const(value="phi"), origin=REF), origin=REF),
)


def fleet(n: int, seed: int) -> tuple:
    rnd = random.Random(seed)
    return tuple(contract(f"m{i}", rnd.choice([(), ("us-west",), ("eu-west",), ("us-west", "eu-west")]),
                          tuple(rnd.sample(("tpm", "memory_encryption", "hardware_firewall"), rnd.randint(0, 2))),
                          rnd.choice((None, 0.1, 0.2, 0.3, 0.4)), rnd.random() < 0.3) for i in range(n))


def test_classes_are_fewer_than_contracts_and_cover_them() -> None:
    b = bundle(fleet(60, 1), RULES)
    classes = group(b.contracts, domains(b))
    assert len(classes) < 60
    assert sorted(n for c in classes for n in c.names) == sorted(c.name for c in b.contracts)


def test_class_encoding_equals_the_union_of_member_domains() -> None:
    b = bundle(fleet(60, 2), RULES)
    dom = domains(b)
    space = Space()
    enc = RuleEncoder(space, dom)
    classes = group(b.contracts, dom)
    for c in classes:
        space.reserve(c.names)
    by_class = enc.fleet_domain(classes)
    by_contract = enc.fleet_domain((), b.contracts)
    s = new_solver()
    s.add(*space.axioms, enc.instance_frame(), by_class != by_contract)
    assert verdict(s.check()) is Verdict.UNSAT


def test_one_range_test_per_class_when_names_are_reserved() -> None:
    b = bundle(fleet(30, 3), RULES)
    space = Space()
    enc = RuleEncoder(space, domains(b))
    classes = group(b.contracts, domains(b))
    for c in classes:
        space.reserve(c.names)
    for c in classes:
        f = enc.name_in(space.attr("model").value, c.names)
        assert not z3.is_or(f), f"{c.names} is not one run of codes: {f}"


def test_diff_sees_a_contract_changed_on_one_side_among_shared_ones() -> None:
    cs = fleet(40, 4)
    old = bundle(cs, RULES)
    changed = list(cs)
    k = next(i for i, c in enumerate(cs) if c.slo is not None)
    changed[k] = cs[k].model_copy(update={"slo": Slo(latency=cs[k].slo.latency * 3)})  # type: ignore[union-attr]
    new = bundle(tuple(changed), RULES)
    report = diff_bundles(old, new, limit=5)
    assert not report.undecided and report.differences
    d_old, d_new = domains(old), domains(new)
    for d in report.differences:
        assert d.instance["model"] == cs[k].name
        assert admitted(old, d_old, d.request, d.instance) != admitted(new, d_new, d.request, d.instance)
        assert (d.direction is Direction.WIDENED) == admitted(new, d_new, d.request, d.instance)
    assert diff_bundles(old, old).exit_code == 0


