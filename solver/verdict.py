"""The three-valued answer every solver check gives: Sat, Unsat or Unknown.

`Unknown` (a timeout, an incomplete theory) is never folded into pass or fail: callers
must say what they do with it. Z3 is always run with a per-check timeout so nothing hangs.
"""

from __future__ import annotations

import enum

import z3

CHECK_TIMEOUT_MS = 5_000


class Verdict(enum.Enum):
    SAT = "sat"
    UNSAT = "unsat"
    UNKNOWN = "unknown"


def new_solver(timeout_ms: int = CHECK_TIMEOUT_MS, ctx: z3.Context | None = None) -> z3.Solver:
    """A solver with the per-check timeout set, in `ctx` (None: Z3's main context); cores
    are minimised where asked for."""
    s = z3.Solver(ctx=ctx)
    s.set("timeout", timeout_ms)
    return s


def verdict(result: z3.CheckSatResult) -> Verdict:
    if result == z3.sat:
        return Verdict.SAT
    if result == z3.unsat:
        return Verdict.UNSAT
    return Verdict.UNKNOWN
