"""Ending a quarantined backend's connections through sock_diag netlink (`ss -K`'s way, in process).

Real sockets in a network namespace the test makes: the connections to the backend end
(their owner reads ECONNABORTED), the listener and connections to any other address stay.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.sock_destroy import SockDestroyError, end_tcp_to


@pytest.fixture
def bare_netns() -> Iterator[str]:
    if os.geteuid() != 0 and os.environ.get("CI", "").lower() != "true":
        pytest.skip("ending sockets needs root (CAP_NET_ADMIN)")
    name = f"pc-sd-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _sockets_in(netns: str, make):  # type: ignore[no-untyped-def]
    from pyroute2.netns import popns, pushns

    pushns(netns)
    try:
        return make()
    finally:
        popns()


def _aborted(s: socket.socket) -> bool:
    s.settimeout(2)
    try:
        s.sendall(b"x")
        s.recv(1)
    except OSError as exc:
        return exc.errno == errno.ECONNABORTED
    return False


def _alive(client: socket.socket, server_side: socket.socket) -> bool:
    client.sendall(b"ping")
    server_side.settimeout(2)
    return server_side.recv(4) == b"ping"


def test_connections_to_the_backend_end_and_nothing_else(bare_netns: str) -> None:
    def make():  # type: ignore[no-untyped-def]
        backend = socket.create_server(("127.0.0.1", 0))
        other = socket.create_server(("127.0.0.1", 0))
        port, other_port = backend.getsockname()[1], other.getsockname()[1]
        to_backend = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        dual = socket.socket(socket.AF_INET6)  # a dual-stack socket, as gRPC opens them: ::ffff:127.0.0.1
        dual.connect(("::ffff:127.0.0.1", port))
        to_backend.append(dual)
        to_other = socket.create_connection(("127.0.0.1", other_port))
        accepted = [backend.accept()[0] for _ in to_backend]
        return backend, other, port, to_backend, to_other, other.accept()[0], accepted

    backend, other, port, to_backend, to_other, other_side, accepted = _sockets_in(bare_netns, make)
    late: socket.socket | None = None
    try:
        assert end_tcp_to(Endpoint.of("127.0.0.1", port), bare_netns) == 3
        assert all(_aborted(s) for s in to_backend)
        assert _alive(to_other, other_side)  # another port on the same address: untouched
        backend.settimeout(0.2)
        late = _sockets_in(bare_netns, lambda: socket.create_connection(("127.0.0.1", port)))  # the listener stays
        accepted.append(backend.accept()[0])
        assert _alive(late, accepted[-1])
        assert end_tcp_to(Endpoint.of("127.0.0.1", port), bare_netns) == 1  # only the new one: the ended ones are gone
        assert _aborted(late)
        assert end_tcp_to(Endpoint.of("127.0.0.1", port), bare_netns) == 0
    finally:
        for s in (backend, other, to_other, other_side, *to_backend, *accepted, *([late] if late else [])):
            s.close()


def test_ipv6_backend(bare_netns: str) -> None:
    def make():  # type: ignore[no-untyped-def]
        srv = socket.create_server(("::1", 0), family=socket.AF_INET6)
        port = srv.getsockname()[1]
        client = socket.create_connection(("::1", port))
        return srv, port, client, srv.accept()[0]

    srv, port, client, accepted = _sockets_in(bare_netns, make)
    try:
        assert end_tcp_to(Endpoint.of("::1", port), bare_netns) == 1
        assert _aborted(client)
    finally:
        for s in (srv, client, accepted):
            s.close()


def test_a_missing_namespace_is_named(bare_netns: str) -> None:
    with pytest.raises(SockDestroyError, match=f"network namespace `{bare_netns}-gone`: No such file"):
        end_tcp_to(Endpoint.of("127.0.0.1", 9), f"{bare_netns}-gone")


def test_many_backends_in_one_walk(bare_netns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import policyc.enforcer.sock_destroy as sd

    monkeypatch.setattr(sd, "MAX_BATCH", 2)  # the batch is split into filters of 2: the split is exercised too

    def make():  # type: ignore[no-untyped-def]
        servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)] + [socket.create_server(("::1", 0), family=socket.AF_INET6)]
        clients = [[socket.create_connection(s.getsockname()[:2]) for _ in range(i + 1)] for i, s in enumerate(servers)]
        accepted = [s.accept()[0] for s, cs in zip(servers, clients) for _ in cs]
        return servers, clients, accepted

    servers, clients, accepted = _sockets_in(bare_netns, make)
    try:
        host = lambda s: s.getsockname()[0]  # noqa: E731
        targets = [Endpoint.of(host(s), s.getsockname()[1]) for s in (servers[0], servers[2], servers[3])]
        counts = sd.end_tcp_to_many([*targets, targets[0]], bare_netns)  # a repeat counts once
        assert counts == {targets[0]: 1, targets[1]: 3, targets[2]: 4}
        assert all(_aborted(c) for i in (0, 2, 3) for c in clients[i])
        assert _alive(clients[1][0], accepted[1]) and _alive(clients[1][1], accepted[2])  # servers[1] was not named
    finally:
        for s in (*servers, *accepted, *(c for cs in clients for c in cs)):
            s.close()


SO_COOKIE = 57  # the socket's kernel cookie, as bpf_get_socket_cookie and sock_diag report it


def test_connections_known_by_cookie_end_and_no_other(bare_netns: str) -> None:
    from policyc.enforcer.sock_destroy import end_tcp_by_cookie

    def make():  # type: ignore[no-untyped-def]
        srv = socket.create_server(("127.0.0.1", 0))
        clients = [socket.create_connection(srv.getsockname()) for _ in range(3)]
        return srv, clients, [srv.accept()[0] for _ in clients]

    srv, clients, accepted = _sockets_in(bare_netns, make)
    try:
        cookies = {int.from_bytes(c.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8), sys.byteorder) for c in clients[:2]}
        assert end_tcp_by_cookie(cookies, bare_netns) == 2
        assert all(_aborted(c) for c in clients[:2])
        assert _alive(clients[2], accepted[2])  # same peer, another cookie: stays
        assert end_tcp_by_cookie(cookies, bare_netns) == 0
    finally:
        for s in (srv, *clients, *accepted):
            s.close()
