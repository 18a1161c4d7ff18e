"""The demo's gateway: `policyc gateway`'s own runner — policyc's endpoint picker on the
decision server's event loop (one engine, one bundle, one audit log), a real Envoy whose
pool follows the registry (file-based EDS) — on free loopback ports."""

from __future__ import annotations

import socket
from pathlib import Path

from policyc.gateway.runner import Gateway, GatewayOptions
from policyc.modelserver import wire
from policyc.server.app import ServerThread


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(thread: ServerThread, workdir: Path) -> Gateway:
    """Start it after the real instances registered: Envoy starts with them in its pool."""
    # The stall header is for the model server (the budget scene), not for the policy.
    options = GatewayOptions(listen=f"127.0.0.1:{_free_port()}", admin=f"127.0.0.1:{_free_port()}",
                             forwarded_headers=frozenset({wire.STALL_MS}), workdir=workdir / "gateway")
    return Gateway(thread, options).start()
