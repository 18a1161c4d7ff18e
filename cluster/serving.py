"""How a decision server becomes a replica: the parts `DecisionServer` builds differently
when it has a fleet store (`ServeConfig.fleet`): the engine that writes registrations to
the store, the placer that shares session affinity, and the `Replica` itself; the
refresher's telemetry gains the host agents' measured signals (`measured_hosts.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import FleetConfig
from .measured_hosts import HostMeasured
from .replica import Replica
from .session_placer import SharedSessionPlacer
from .shared_engine import SharedRegistryEngine

if TYPE_CHECKING:
    from policyc.placer import Placer
    from policyc.server.app import DecisionServer


def replica_parts(cfg: FleetConfig, server: "DecisionServer", placer: "Placer") -> tuple[Replica, SharedSessionPlacer, type[SharedRegistryEngine]]:
    replica = Replica(cfg, server)
    # the host agents' measured signals join the service's telemetry, each with its age
    server.refresher.source = HostMeasured(server.refresher.source, replica.host_signals)
    return replica, SharedSessionPlacer(placer, replica.sessions), SharedRegistryEngine
