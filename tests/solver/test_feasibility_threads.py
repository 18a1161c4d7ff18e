"""Request feasibility across threads: each `RequestFeasibility` solves in a Z3 context of
its own, so one state's solver thread checking while another state is built (a reload, or
the next server in a process) and a third's terms are freed never share a context (Z3's
contexts are not thread-safe: that mix crashed the process with SIGSEGV)."""

from __future__ import annotations

import gc
import threading

from policyc.compiler.pipeline import compile_paths
from policyc.solver.feasibility import Feasible, Infeasible, RequestFeasibility


def test_solving_while_other_states_are_built_and_freed() -> None:
    bundle = compile_paths(["policies"]).bundle
    solving = RequestFeasibility(bundle)
    shapes = [{"tenant": "shopwave", "slo": 0.001 * (5 + n)} for n in range(400)]
    answers: list[object] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def solve_all() -> None:
        try:
            for q in shapes:
                if stop.is_set():
                    return
                answers.append(solving.solve(q))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    t = threading.Thread(target=solve_all)
    t.start()
    try:
        built = 0
        while t.is_alive() and built < 6:  # states made and dropped while the other thread checks
            other = RequestFeasibility(bundle)
            assert other.space.ctx is not solving.space.ctx
            assert isinstance(other.check({"tenant": "acme-bank", "region": "us-west"}), Feasible)
            del other
            gc.collect()
            built += 1
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert built >= 1 and answers
    fresh = RequestFeasibility(bundle)
    for q, got in zip(shapes, answers):
        want = fresh.solve(q)
        assert type(got) is type(want) and (not isinstance(want, Infeasible) or got.rule_ids == want.rule_ids)  # type: ignore[attr-defined]
