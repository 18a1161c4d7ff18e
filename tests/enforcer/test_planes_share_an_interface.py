"""Two kernel planes (two policyc processes, say a decision service and a benchmark) on one
interface: each attaches filters of its own handle at the shared priority, each counts all
the traffic (the observers pass a packet on to the next filter instead of ending the chain),
each detaches only its own, and the clsact qdisc the first one added goes with the last
policyc filter under it, whichever plane's that is. Root and BPF, as in CI."""

from __future__ import annotations

import subprocess
import sys

from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.kernel_plane import KernelPlane

PORT = 7311
ECHO = f"""
import socket, threading
srv = socket.socket(); srv.bind(("127.0.0.1", {PORT})); srv.listen(1)
def serve():
    c, _ = srv.accept()
    while (b := c.recv(65536)):
        c.sendall(b)
    c.close()
t = threading.Thread(target=serve); t.start()
cli = socket.create_connection(("127.0.0.1", {PORT}))
for _ in range(20):
    cli.sendall(b"x" * 1000); got = 0
    while got < 1000:
        got += len(cli.recv(65536))
cli.close(); t.join()
"""


def tc(netns: str, *args: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "tc", *args], capture_output=True, text=True).stdout


def echo(netns: str) -> None:
    subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", ECHO], check=True, timeout=30)


def test_two_planes_each_count_everything_and_detach_only_their_own(kernel_plane: KernelPlane, netns: str) -> None:
    # `kernel_plane` is on the netns's lo (the fixture added its clsact); a second plane joins it
    other = KernelPlane(MemoryAudit())
    try:
        other.attach_tc("lo", netns)
        server = Endpoint.parse(f"127.0.0.1:{PORT}")
        for plane in (kernel_plane, other):
            plane.register_backend(server, 7)
        echo(netns)
        counted = [plane.backend_counters(7, "egress", True).payload for plane in (kernel_plane, other)]
        assert counted[0] == counted[1] == 20_000, counted  # the same 20 x 1000 B toward the server, in both
        kernel_plane.detach_tc("lo", netns)  # the plane that added clsact leaves first
        assert f"handle 0x{kernel_plane._tc_handle:x} " not in tc(netns, "filter", "show", "dev", "lo", "ingress")
        assert f"handle 0x{other._tc_handle:x} " in tc(netns, "filter", "show", "dev", "lo", "ingress")
        echo(netns)  # the other still observes, under the same qdisc
        assert other.backend_counters(7, "egress", True).payload == 40_000
        assert "clsact" in tc(netns, "qdisc", "show", "dev", "lo")
        other.detach_tc("lo", netns)  # the last policyc filter goes: the qdisc policyc added goes too
        assert "clsact" not in tc(netns, "qdisc", "show", "dev", "lo")
        assert tc(netns, "filter", "show", "dev", "lo", "egress").strip() == ""
    finally:
        other.close()
        kernel_plane.unregister_backend(Endpoint.parse(f"127.0.0.1:{PORT}"))
        if not any(a.netns == netns for a in kernel_plane._tc):
            kernel_plane.attach_tc("lo", netns)  # as the fixture left it, for its own detach
