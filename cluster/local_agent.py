"""The embedded default's host agent: one process and no etcd, so the decision service
runs the agent for its own host in process, on its own local store. The local host's facts
(interfaces, addresses) and measured signals (ports, disks, the agent's own period) then
reach the replica as every other host's do — `agents/<host>` and `signals/<host>`, read by
the same watch, merged by the same `HostMeasured` — instead of through a reader of its own.

It runs when the service's topology has this host in it (`--telemetry local`: the
topology's one host is this machine). With the simulator (the default for what-if and
benchmarks) this machine is no host of the fleet: there is none to run, and the log says so.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from .host_agent import HostAgent

if TYPE_CHECKING:
    from .replica import Replica

log = logging.getLogger("policyc.cluster")


def local_host(replica: "Replica") -> str | None:
    """This machine's name in the service's topology, or None where it has none."""
    refresher = getattr(replica.server, "refresher", None)
    if refresher is None:
        return None
    names = {h.name for h in refresher.source.topology().hosts}
    me = os.uname().nodename
    return me if me in names else None


async def start_local_agent(replica: "Replica", *, signal_period: float = 0.2) -> HostAgent | None:
    """The in-process agent for this host on the replica's own store (None: not in the topology)."""
    host = local_host(replica)
    if host is None:
        log.info("replica %s: this machine is not a host of the topology (simulated fleet): no in-process agent", replica.name)
        return None
    agent = HostAgent(replica.store, replica.keys, host, None, ttl=replica.cfg.lease_ttl, signal_period=signal_period)
    await agent.start()
    log.info("replica %s: in-process agent for host %s (its facts and signals through the local store)", replica.name, host)
    return agent


__all__ = ["local_host", "start_local_agent"]
