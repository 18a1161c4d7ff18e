"""How a decision server becomes a replica: the parts `DecisionServer` builds differently
when it has a fleet store (`ServeConfig.fleet`): the engine that writes registrations to
the store, the placer that shares session affinity, and the `Replica` itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import FleetConfig
from .replica import Replica
from .session_placer import SharedSessionPlacer
from .shared_engine import SharedRegistryEngine

if TYPE_CHECKING:
    from policyc.placer import Placer
    from policyc.server.app import DecisionServer


def replica_parts(cfg: FleetConfig, server: "DecisionServer", placer: "Placer") -> tuple[Replica, SharedSessionPlacer, type[SharedRegistryEngine]]:
    replica = Replica(cfg, server)
    return replica, SharedSessionPlacer(placer, replica.sessions), SharedRegistryEngine
