"""Many policyc replicas sharing one fleet: the registry, bundles, leadership and soft state
kept in etcd (through aetcd), and the local store of the embedded default.

`InstanceAgent` is what a model server uses to keep its instance registered under its own
lease; `Replica` is what `policyc serve --etcd` runs beside the decision server; the rest
is in the modules named for each job (see the README's "Many replicas on etcd")."""

from __future__ import annotations

from typing import Any

__all__ = ["EtcdStore", "FleetConfig", "InstanceAgent", "LocalStore", "Replica"]
_WHERE = {"EtcdStore": "etcd_store", "FleetConfig": "config", "InstanceAgent": "agent", "LocalStore": "local_store",
          "Replica": "replica"}


def __getattr__(name: str) -> Any:
    """Imported on first use: `policyc.server.config` imports `cluster.config`, which must not
    pull the server (or aetcd) in with it."""
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"policyc.cluster.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'policyc.cluster' has no attribute {name!r}")
