"""How a replica joins its cluster: the store (etcd endpoints, or the embedded default's
state directory), its name and lease, and how bundles from the store are verified.

Kept free of server imports, so that `server/config.py` can carry one of these."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .keys import DEFAULT_PREFIX


@dataclass(frozen=True)
class FleetConfig:
    etcd: tuple[str, ...] = ()  # empty: the embedded default (a local store in `state_dir`)
    state_dir: Path | None = None
    prefix: str = DEFAULT_PREFIX
    name: str = ""  # this replica's name in the cluster (default: host-pid)
    lease_ttl: int = 5  # seconds: a replica (and its leadership) that stops answering is gone after this
    public_key: Any = None  # Ed25519PublicKey: bundles from the store must be signed by it
    advertise: str = ""  # the address other parts of the fleet (Envoy, status) reach this replica at
    session_ttl: float = 3600.0  # a session's affinity lasts this long after its last request
    report_interval: float = 1.0  # how often the replica refreshes its report (applied revision, lag)
    anchor_interval: float = 2.0  # how often its audit log's latest checkpoint is anchored in the store
    op_timeout: float = 5.0  # how long a store write waits out an election before giving up
    # a host's TPM attestation counts this long (seconds); the leader re-attests enrolled hosts
    # well before (see cluster/attestation.py: once a host is enrolled, `tpm` claims need one)
    attest_max_age: float = 600.0

    def __post_init__(self) -> None:
        if not self.etcd and self.state_dir is None:
            raise ValueError("a fleet store needs etcd endpoints or a state directory")
        if self.lease_ttl < 2:
            raise ValueError(f"lease TTL must be at least 2 s, got {self.lease_ttl}")

    @property
    def replica_name(self) -> str:
        return self.name or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def shared(self) -> bool:
        return bool(self.etcd)
