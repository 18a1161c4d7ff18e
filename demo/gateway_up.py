"""The demo's gateway: policyc's endpoint picker on the decision server's own event loop
(one engine, one bundle, one audit log) and a real Envoy in front of the real model
servers, on free loopback ports."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap
from policyc.gateway.envoy_process import EnvoyProcess
from policyc.gateway.picker import PickerConfig
from policyc.gateway.server import PickerServer
from policyc.modelserver import wire
from policyc.server.app import DecisionServer, ServerThread


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningGateway:
    picker: PickerServer
    envoy: EnvoyProcess
    listen: str  # where clients send their requests
    thread: ServerThread

    def stop(self) -> None:
        self.envoy.stop()
        self.thread.call(self.picker.stop())


def start_gateway(server: DecisionServer, thread: ServerThread, endpoints: tuple[str, ...], workdir: Path) -> RunningGateway:
    # The stall header is for the model server (the budget scene), not for the policy.
    picker = PickerServer(server, PickerConfig(forwarded_headers=frozenset({wire.STALL_MS})))
    port = thread.call(picker.start())
    listen = f"127.0.0.1:{_free_port()}"
    spec = GatewaySpec(picker=f"127.0.0.1:{port}", listen=listen, admin=f"127.0.0.1:{_free_port()}", endpoints=endpoints)
    try:
        envoy = EnvoyProcess(build_bootstrap(spec), workdir / "envoy").start()
    except BaseException:
        thread.call(picker.stop())
        raise
    return RunningGateway(picker, envoy, listen, thread)
