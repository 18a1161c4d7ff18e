"""Session affinity across replicas: a session keeps its instance whichever replica its
requests land on.

Wraps the replica's placer for the engine. A request with a session whose instance the
shared book names (`SessionBook`) is placed on that instance first, when it is among the
candidates and feasible there (the placer's own session logic then keeps it next to its
state store); otherwise it is placed as usual, and the instance chosen becomes the
session's. The book is a local mirror, so this costs a dict lookup; publishing a new
affinity happens in the background.
"""

from __future__ import annotations

from typing import Any, Sequence

from policyc.compiler.bundle import Contract
from policyc.matcher import Instance
from policyc.placer import NoPlacement, PlacementPlan, Placer

from .soft_state import SessionBook


class SharedSessionPlacer:
    def __init__(self, placer: Placer, sessions: SessionBook) -> None:
        self._placer = placer
        self.sessions = sessions

    def place(self, candidates: Sequence[Instance], budget: float, contract: Contract, session: str | None = None,
              **kw: Any) -> PlacementPlan | NoPlacement:
        if session is None:
            return self._placer.place(candidates, budget, contract, session, **kw)
        want = self.sessions.instance_of(session)
        if want is not None:
            pinned = [c for c in candidates if c.id == want]
            if pinned:
                plan = self._placer.place(pinned, budget, contract, session, **kw)
                if isinstance(plan, PlacementPlan):
                    self.sessions.keep(session, plan.instance_id)
                    return plan
        plan = self._placer.place(candidates, budget, contract, session, **kw)
        if isinstance(plan, PlacementPlan):
            self.sessions.keep(session, plan.instance_id)
        return plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._placer, name)
