"""Real-kernel tests: each in its own network namespace with real loopback servers."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyroute2.netns import popns, pushns

from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.kernel_plane import KernelPlane, monotonic_deadline_ns
from policyc.enforcer.records import ActionKind


@contextmanager
def inside(netns: str) -> Iterator[None]:
    """Sockets created in this block belong to `netns` (setns affects this thread only)."""
    pushns(netns)
    try:
        yield
    finally:
        popns()


@contextmanager
def in_cgroup(cgroup: Path) -> Iterator[None]:
    """Move this process into `cgroup` for the block, then back where it was."""
    home = Path("/proc/self/cgroup").read_text().strip().split("::")[-1]
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield
    finally:
        root = cgroup.parent
        (root / home.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))


def _server(name: str, log: list[str]) -> tuple[socket.socket, Endpoint]:
    srv = socket.socket(socket.AF_INET6)
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind(("::", 0))
    srv.listen()

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            log.append(name)
            conn.sendall(name.encode())
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return srv, Endpoint.of("127.0.0.1", srv.getsockname()[1])


def _wait_for(pred, timeout: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_per_flow_counters_equal_bytes_sent(kernel_plane: KernelPlane, netns: str) -> None:
    sent = 1_234_567
    with inside(netns):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    server_ep = Endpoint.of(*srv.getsockname())
    kernel_plane.register_backend(server_ep, 7)
    cli.sendall(os.urandom(sent))
    got = 0
    while got < sent:
        got += len(conn.recv(1 << 20))
    conn.sendall(b"ok" * 500)
    assert cli.recv(4096)
    src, dst = Endpoint.of(*cli.getsockname()), Endpoint.of(*cli.getpeername())
    assert _wait_for(lambda: kernel_plane.flow(src, dst, "ingress").payload == sent), kernel_plane.flow(src, dst, "ingress")
    assert kernel_plane.flow(src, dst, "egress").payload == sent, kernel_plane.flow(src, dst, "egress")
    assert kernel_plane.backend_counters(7, "egress", toward=True).payload == sent
    assert _wait_for(lambda: kernel_plane.backend_counters(7, "ingress", toward=False).payload >= 1)
    for s in (cli, conn, srv):
        s.close()


def test_quarantine_redirects_new_ipv4_and_mapped_ipv6_connects(
    kernel_plane: KernelPlane, netns: str, cgroup: Path, kernel_audit: MemoryAudit
) -> None:
    served: list[str] = []
    with inside(netns):
        primary, p_ep = _server("primary", served)
        backup, b_ep = _server("backup", served)
    before = len(kernel_audit.records)
    kernel_plane.quarantine(p_ep, b_ep, 5, monotonic_deadline_ns(30))
    with in_cgroup(cgroup):
        with inside(netns):
            v4 = socket.create_connection(("127.0.0.1", p_ep.port))
            v6 = socket.socket(socket.AF_INET6)
            v6.connect(("::ffff:127.0.0.1", p_ep.port))
    assert v4.recv(16) == b"backup"
    assert v6.recv(16) == b"backup"
    kernel_plane.release(p_ep)
    with in_cgroup(cgroup):
        with inside(netns):
            again = socket.create_connection(("127.0.0.1", p_ep.port))
    assert again.recv(16) == b"primary"
    kernel_plane.drain()
    assert _wait_for(lambda: len([r for r in kernel_audit.records[before:] if r.kind is ActionKind.KERNEL_REDIRECT]) == 2)
    changes = [r.target for r in kernel_audit.records[before:] if r.kind is ActionKind.MAP_CHANGE]
    assert f"quarantine_set {p_ep}" in changes and f"quarantine_del {p_ep}" in changes
    for s in (v4, v6, again, primary, backup):
        s.close()


def test_expired_quarantine_is_ignored_by_the_kernel(kernel_plane: KernelPlane, netns: str, cgroup: Path) -> None:
    served: list[str] = []
    with inside(netns):
        primary, p_ep = _server("primary", served)
        backup, b_ep = _server("backup", served)
    kernel_plane.quarantine(p_ep, b_ep, 5, monotonic_deadline_ns(0.05))
    time.sleep(0.1)
    with in_cgroup(cgroup):
        with inside(netns):
            s = socket.create_connection(("127.0.0.1", p_ep.port))
    assert s.recv(16) == b"primary"
    for x in (s, primary, backup):
        x.close()


def test_tc_drop_of_traffic_to_quarantined_backend_is_audited(
    kernel_plane: KernelPlane, netns: str, kernel_audit: MemoryAudit
) -> None:
    with inside(netns):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    ep = Endpoint.of(*srv.getsockname())
    before = len(kernel_audit.records)
    kernel_plane.quarantine(ep, Endpoint.of("127.0.0.1", 9), 4, monotonic_deadline_ns(30))
    kernel_plane.set_tc_drop(True)
    try:
        cli.sendall(b"dropped")
        conn.settimeout(0.3)
        try:
            data = conn.recv(16)
        except TimeoutError:
            data = b""
        assert data == b""
    finally:
        kernel_plane.set_tc_drop(False)
        kernel_plane.release(ep)
    assert _wait_for(lambda: any(r.kind is ActionKind.KERNEL_DROP for r in kernel_audit.records[before:]))
    for s in (cli, conn, srv):
        s.close()


def test_new_bundle_updates_rule_maps_without_reloading(kernel_plane: KernelPlane, kernel_audit: MemoryAudit) -> None:

    from enforcer_support import make_bundle

    from policyc.enforcer.rule_table import build_rule_table

    prog_fd = kernel_plane._fn_egress.fd  # the attached program must stay the same object
    kernel_plane.apply_rules(build_rule_table(make_bundle(slo=0.2)).kernel_rules())
    assert kernel_plane.rule_budgets() == {1: 185_000_000}
    before = len(kernel_audit.records)
    kernel_plane.apply_rules(build_rule_table(make_bundle(slo=0.4)).kernel_rules())
    assert kernel_plane.rule_budgets() == {1: 370_000_000}
    assert kernel_plane._fn_egress.fd == prog_fd
    kernel_plane.drain()
    assert _wait_for(lambda: any(r.kind is ActionKind.MAP_CHANGE and "rule_set" in r.target for r in kernel_audit.records[before:]))
