"""`policyc serve`'s cluster flags, and the `FleetConfig` they make.

    --etcd URL…          share the fleet with other replicas through etcd
    --etcd-prefix P      the key prefix (one cluster per prefix; default /policyc/)
    --name NAME          this replica's name (default host-pid)
    --lease-ttl S        the replica's lease: how long a dead replica (or leader) lingers
    --advertise H:P      the address others (Envoy, `policyc cluster status`) reach it at
    --state-dir DIR      without --etcd: where the embedded default keeps its registry
                         (default ~/.local/state/policyc/serve-PORT; none with --port 0;
                         `--state-dir none` turns it off); the operator token the
                         service makes is kept there too (`token_dir`)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .config import FleetConfig
from .keys import DEFAULT_PREFIX


def add_fleet_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (many replicas sharing one fleet)")
    g.add_argument("--etcd", nargs="+", metavar="URL", help="etcd endpoints (http://HOST:PORT …): share the fleet with other replicas")
    g.add_argument("--etcd-prefix", default=DEFAULT_PREFIX, help=f"key prefix of this cluster in etcd (default {DEFAULT_PREFIX})")
    g.add_argument("--name", help="this replica's name in the cluster (default HOST-PID)")
    g.add_argument("--lease-ttl", type=int, default=5, metavar="S", help="replica lease TTL, seconds (default 5)")
    g.add_argument("--advertise", metavar="HOST:PORT", help="address other parts of the fleet reach this replica at")
    g.add_argument("--state-dir", help="without --etcd: keep the registry here across restarts "
                                       "(default ~/.local/state/policyc/serve-PORT; `none`: do not)")


def default_state_dir(port: int) -> Path | None:
    if port == 0:  # an ephemeral port is a throw-away server (tests): nothing to come back to
        return None
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "policyc" / f"serve-{port}"


def token_dir(args: Any, fleet: FleetConfig | None, port: int) -> Path | None:
    """Where the service keeps the operator token it makes (`server/operator_token.py`):
    its state dir; a replica on a fixed port, the default state dir of its port (the CLI on
    the same machine looks there); None (a throw-away service: `--port 0`, `--state-dir
    none`): the runtime dir's entry for the bound port."""
    if fleet is not None and fleet.state_dir is not None:
        return fleet.state_dir
    if getattr(args, "state_dir", None) == "none":
        return None
    return default_state_dir(port)


def fleet_config(args: Any, public_key: Any) -> FleetConfig | None:
    """The flags' FleetConfig (None: one process, nothing kept); ValueError names a bad flag."""
    if args.lease_ttl < 2:
        raise ValueError(f"--lease-ttl must be at least 2 seconds, got {args.lease_ttl}")
    common: dict[str, Any] = {"prefix": args.etcd_prefix, "name": args.name or "", "lease_ttl": args.lease_ttl,
                              "public_key": public_key, "advertise": args.advertise or ""}
    if args.etcd:
        if args.state_dir:
            raise ValueError("--state-dir is for the embedded default; with --etcd the fleet lives in etcd")
        from .etcd_store import parse_endpoints

        parse_endpoints(args.etcd)  # a bad endpoint is a usage error now, not at start
        return FleetConfig(etcd=tuple(args.etcd), **common)
    state = None if args.state_dir == "none" else Path(args.state_dir) if args.state_dir else default_state_dir(args.port)
    if state is None:
        return None
    return FleetConfig(state_dir=state, **common)
