"""What every request of one shape shares, kept so that repeated shapes skip the work.

Most traffic repeats a few request shapes (the same headers from the same callers). For a
given policy state, parsing those headers and the solver's feasibility answer never
change (`Prepared`), and the matcher's answer changes only when the registry does
(`MatchMemo`, checked against the engine's registry generation; score pushes re-rank it at
most once a refresher tick). Below the per-shape memo, the matcher's answer is shared by
every request of the same reduced shape (`Ranked`, one table in the engine), so a new raw
shape (a new SLO value) usually finds it ranked already. Placement is never kept: it reads
the live topology and reserves GPU share on every call.
"""

from __future__ import annotations

from dataclasses import dataclass

from policyc.compiler.bundle import Contract
from policyc.matcher import Instance, MatchResult, Request
from policyc.solver.feasibility import Answer

from .decision import DecisionInput, Rejection
from .state import PolicyState


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    """A request parsed against `state` with the solver's answer, and what each step took
    (seconds) when it was prepared."""

    state: PolicyState
    input: DecisionInput
    request: Request
    retry: int
    answer: Answer
    parse: float
    feasibility: float


@dataclass(frozen=True, slots=True, eq=False)
class Matched:
    """The matcher's answer for one prepared request at one registry `generation`: the
    rejection when nothing matched, otherwise the placement attempts in model order, each
    model's candidates in windows, as (label: the model, and which of its candidates after
    the first window; contract, candidates, latency budget in seconds, session), and each candidate's
    region by instance id (read here once, not from the instances on every decision)."""

    generation: int  # the registry's structure (registrations, removals) it was matched on
    scores: int  # the score pushes it had seen
    made_at: float  # time.monotonic() when matched
    state: PolicyState
    result: MatchResult
    tries: tuple[tuple[str, Contract, tuple[Instance, ...], float, str | None], ...]
    rejection: Rejection | None
    regions: dict[str, str]
    endpoints: dict[str, str]  # candidate id -> `ip:port`, for candidates that have one


@dataclass(frozen=True, slots=True, eq=False)
class Ranked:
    """The matcher's answer for one *reduced* request shape (`FleetIndex.shape_key`: every
    request with an equal key gets an equal answer, so raw shapes that differ only in an
    SLO between the same two thresholds share it) at one registry `generation`, with what
    placement needs from it apart from a request's own budget and session: the placement
    windows in model order as (label, contract, candidates), each candidate's region and
    endpoint. `Matched` adds the request's budgets and session to the windows."""

    generation: int
    scores: int
    made_at: float
    state: PolicyState
    result: MatchResult
    rejection: Rejection | None
    windows: tuple[tuple[str, Contract, tuple[Instance, ...]], ...]
    regions: dict[str, str]
    endpoints: dict[str, str]


class MatchMemo:
    """One request shape's last `Matched`; replaced as a whole (one reference), so a reader
    on another thread sees either the old answer or the new one. `refused`: the shape's
    feasibility rejection with the solver's answer it was made from (the same answer object
    while the state lasts, so every request of the shape the solver rules out hands on one
    `Rejection` instead of making its own)."""

    __slots__ = ("entry", "refused")

    def __init__(self) -> None:
        self.entry: Matched | None = None
        self.refused: tuple[Answer, Rejection] | None = None
