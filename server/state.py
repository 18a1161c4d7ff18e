"""The policy state a decision reads: one bundle, the registry indexed for it, and the
solver's feasibility cache for it, as one immutable object.

A decision takes `engine.state` once and uses only that object, so a hot reload (which
builds a complete new state off to the side and swaps one reference) can never mix two
bundles in one decision, and every decision names the bundle it used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from policyc.compiler.bundle import Bundle
from policyc.matcher import Instance, Registry
from policyc.solver.feasibility import RequestFeasibility


@dataclass(frozen=True, slots=True)
class PolicyState:
    bundle: Bundle
    registry: Registry
    feasibility: RequestFeasibility

    @property
    def bundle_hash(self) -> str:
        return self.bundle.content_hash


def build_state(bundle: Bundle, instances: Iterable[Instance] = (), scores: Mapping[str, float] | None = None) -> PolicyState:
    """A complete state for `bundle`; registry admission errors propagate (nothing swapped)."""
    return PolicyState(bundle, Registry(bundle, instances, scores), RequestFeasibility(bundle))
