"""Z3 contract feasibility against the brute-force reference: verdicts agree, cores
really conflict (and are minimal), on small exact domains."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from policyc.solver.contract_check import check
from policyc.solver.contract_clauses import Clause, ContractFacts, GpuFacts
from policyc.solver.contract_reference import feasible
from policyc.solver.verdict import Verdict

GPUS = (GpuFacts("A", "ampere", Fraction(300), True, Fraction(100)),
        GpuFacts("H", "hopper", Fraction(1000), True, Fraction(300)),
        GpuFacts("L", "ada", Fraction(100), False, Fraction(30)))

facts_st = st.builds(
    ContractFacts,
    name=st.just("c"),
    flops_lo=st.integers(0, 40).map(Fraction), flops_hi=st.integers(0, 40).map(Fraction),
    efficiency=st.sampled_from([Fraction(1, 10), Fraction(1, 2), Fraction(1)]),
    bandwidth=st.sampled_from([Fraction(10), Fraction(50), Fraction(200), Fraction(400)]),
    latency=st.one_of(st.none(), st.sampled_from([Fraction(1, 100), Fraction(1, 10), Fraction(1)])),
    allowance=st.sampled_from([Fraction(0), Fraction(1, 100), Fraction(1, 20)]),
    archs=st.sampled_from([(), ("ampere",), ("ada",), ("hopper", "ada")]),
    precision=st.just("fp16"),
    gpus=st.sampled_from([GPUS, GPUS[:1], GPUS[2:], ()]),
)


@settings(max_examples=80, deadline=None)
@given(facts_st)
def test_verdict_and_core_agree_with_brute_force(f: ContractFacts) -> None:
    result = check(f)
    assert result.verdict is not Verdict.UNKNOWN
    expected = feasible(f, f.clauses())
    assert (result.verdict is Verdict.SAT) == expected
    if result.verdict is Verdict.UNSAT:
        assert result.core, "an unsat verdict names at least one clause"
        assert not feasible(f, result.core), f"core {result.core} does not conflict"
        for c in result.core:
            rest = [x for x in result.core if x is not c]
            assert feasible(f, rest), f"core {result.core} is not minimal: {c} can go"


def test_upside_down_interval_core_is_the_flops_field() -> None:
    f = ContractFacts("c", Fraction(5), Fraction(1), Fraction(1, 2), Fraction(1), None, Fraction(0), (), "fp16", GPUS)
    assert check(f).core == (Clause.FLOPS,)
