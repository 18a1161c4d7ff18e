"""Solver figures: check of N generated contracts, diff of two N-contract bundles, and
cached request feasibility p50/p99 (against the uncached Z3 check as baseline).

    .venv/bin/python benchmarks/solver.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from policyc.compiler.bundle import (Compute, Contract, Dependencies, Interval, Memory, Slo, SourceRef)
from policyc.compiler.pipeline import compile_paths
from policyc.solver.analyse import analyse
from policyc.solver.contract_check import check_contract
from policyc.solver.diff import diff_bundles
from policyc.solver.feasibility import RequestFeasibility

REGIONS = ("us-west", "us-east", "eu-west", "eu-central")


def contracts(n: int, seed: int) -> tuple[Contract, ...]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        lo = 10 ** rnd.uniform(10, 12.5)
        ref = SourceRef(file="gen.contract", line=i + 1, col=1)
        out.append(Contract(
            name=f"model-{i:04d}", version="1.0", origin=ref,
            compute=Compute(flops=Interval(lo=lo, hi=lo * rnd.uniform(1.0, 1.5)), per="request", tokens=128,
                            precision=rnd.choice(("fp16", "bf16", "int8")), efficiency=rnd.uniform(0.3, 0.6)),
            memory=Memory(bandwidth_min=rnd.uniform(20e9, 2000e9), burst_max=0.1), dependencies=Dependencies(),
            slo=Slo(latency=rnd.uniform(0.05, 2.0), allowance=0.02),
            regions=tuple(rnd.sample(REGIONS, rnd.randint(0, 2))),
            security=tuple(rnd.sample(("tpm", "memory_encryption", "hardware_firewall"), rnd.randint(0, 2))),  # type: ignore[arg-type]
            labels=(("tier", rnd.choice(("gold", "silver"))),),
        ))
    return tuple(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 200 if args.quick else 1000
    base = compile_paths(["policies"]).bundle
    assert base is not None
    cs = contracts(n, 1)

    # 1. contract feasibility check, baseline: the closed-form share bound per GPU class
    from policyc.solver.shares import gpu_shares
    t = time.perf_counter()
    errors = sum(len(check_contract(c, base.gpu_catalog)) for c in cs)
    z3_s = time.perf_counter() - t
    t = time.perf_counter()
    for c in cs:
        gpu_shares(c, base.gpu_catalog)
    closed_s = time.perf_counter() - t
    print(f"contract check, {n} contracts: {z3_s:.2f} s ({z3_s / n * 1e3:.2f} ms each, {errors} infeasible); "
          f"closed-form shares baseline {closed_s:.3f} s; ratio {z3_s / closed_s:.0f}x  [floor: < 20 s at 1000]")

    # 2. full analyse stage (contracts + shares + rules) on a bundle with the real rules
    b_old = base.model_copy(update={"contracts": cs})
    t = time.perf_counter()
    analyse(b_old)
    print(f"analyse stage, {n} contracts + {len(base.rules)} rules: {time.perf_counter() - t:.2f} s")

    # 3. diff of two N-contract bundles: NEW relaxes one compliance rule and changes 1 % of contracts
    rules = list(base.rules)
    fin = next(i for i, r in enumerate(rules) if r.id == "compliance.finance-hardening")
    rules[fin] = rules[fin].model_copy(update={"require": rules[fin].require.args[0]})  # only tpm  # type: ignore[union-attr]
    changed = list(cs)
    for i in range(0, n, 100):
        changed[i] = changed[i].model_copy(update={"slo": Slo(latency=changed[i].slo.latency * 2, allowance=0.02)})  # type: ignore[union-attr]
    b_new = base.model_copy(update={"contracts": tuple(changed), "rules": tuple(rules)})
    t = time.perf_counter()
    report = diff_bundles(b_old, b_new, limit=10)
    diff_s = time.perf_counter() - t
    t = time.perf_counter()
    same = diff_bundles(b_old, b_old, limit=10)
    eq_s = time.perf_counter() - t
    print(f"diff, two {n}-contract bundles: {diff_s:.2f} s ({len(report.differences)} differences listed, "
          f"{len(report.undecided)} undecided, exit "
          f"{report.exit_code}); identical bundles: {eq_s:.2f} s (exit {same.exit_code})  [floor: < 60 s at 1000]")

    # baselines in the same run: every contract its own disjunct (the encoding before
    # instance classes), at the --quick size, since at 1000 it takes minutes
    from policyc.solver.rule_check import check_rules
    m = 200
    b_small = base.model_copy(update={"contracts": cs[:m]})
    bn_small = b_new.model_copy(update={"contracts": tuple(changed[:m])})
    times = {}
    for per_contract in (False, True):
        t = time.perf_counter()
        check_rules(b_small, per_contract=per_contract)
        times[("rules", per_contract)] = time.perf_counter() - t
        t = time.perf_counter()
        rep = diff_bundles(b_small, bn_small, limit=10, use_classes=not per_contract)
        times[("diff", per_contract)] = time.perf_counter() - t
        times[("undecided", per_contract)] = len(rep.undecided)
    print(f"rule analyses, {m} contracts: classes {times[('rules', False)]:.2f} s, per-contract baseline "
          f"{times[('rules', True)]:.2f} s; ratio {times[('rules', True)] / times[('rules', False)]:.2f}x")
    print(f"diff, {m} contracts: classes {times[('diff', False)]:.2f} s ({times[('undecided', False)]} undecided), "
          f"per-contract baseline {times[('diff', True)]:.2f} s ({times[('undecided', True)]} undecided); "
          f"ratio {times[('diff', True)] / times[('diff', False)]:.2f}x")

    # 4. request feasibility: cached (by shape) vs uncached Z3
    f = RequestFeasibility(b_old)
    rnd = random.Random(2)
    tenants = [t.name for t in base.tenants]
    reqs = []
    for _ in range(200):
        q: dict = {"tenant": rnd.choice(tenants)}
        if rnd.random() < 0.7:
            q["region"] = rnd.choice(REGIONS)
        if rnd.random() < 0.7:
            q["slo"] = rnd.choice((0.05, 0.1, 0.2, 0.5, 1.0))
        reqs.append(q)
    t = time.perf_counter()
    for q in reqs[:50]:
        f.solve(q)
    miss_us = (time.perf_counter() - t) / 50 * 1e6
    for q in reqs:
        f.check(q)  # warm
    samples = []
    rounds = 20_000 if args.quick else 100_000
    for i in range(rounds):
        q = reqs[i % len(reqs)]
        t0 = time.perf_counter_ns()
        f.check(q)
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    p50 = samples[len(samples) // 2] / 1e3
    p99 = samples[int(len(samples) * 0.99)] / 1e3
    print(f"request feasibility, cached: p50 {p50:.2f} us, p99 {p99:.2f} us, mean {statistics.fmean(samples) / 1e3:.2f} us; "
          f"uncached Z3 baseline {miss_us:.0f} us; ratio {miss_us / p50:.0f}x  [floor: p50 < 10 us]")


if __name__ == "__main__":
    main()
