"""End the established TCP connections to given addresses, in the kernel, by netlink (sock_diag).

This is what `ss -K dst A dport = :P` does, without spawning it: one dump request per
address family whose filter the kernel runs itself (inet_diag bytecode: destination
address and port, any of the backends asked for), then one `SOCK_DESTROY` per socket
found, all sent in a single message and acknowledged one by one. The kernel aborts each
socket as `tcp_abort` does (the peer gets a RST, the owner ECONNABORTED), so its owner
reconnects and the connect hooks send the new connection to the backup. Where the process
ran `ss` for every quarantine (fork, exec, parse its output: ~3 ms, much of it holding the
interpreter lock, which made the next budget crossing late), this costs ~0.3 ms, nearly
all of it the kernel walking its socket table with the lock released, and the same for a
thousand backends as for one. `end_tcp_by_cookie` ends sockets known by their kernel
cookies instead (those a quarantine's connect hooks redirected, ended at its release).
Needs CAP_NET_ADMIN and a kernel built with CONFIG_INET_DIAG_DESTROY.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import socket
import struct
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

from policyc.enforcer.endpoint import Endpoint

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
SOCK_DESTROY = 21
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
INET_DIAG_REQ_BYTECODE = 1
INET_DIAG_BC_JMP = 1
INET_DIAG_BC_D_COND = 8
MAX_BATCH = 1000  # backends in one filter: its jumps are 16-bit
CLONE_NEWNET = 0x40000000

# The states `ss` calls connected (its default): all but LISTEN, CLOSE, TIME_WAIT, SYN_RECV.
_TCP_ESTABLISHED, _TCP_SYN_SENT, _TCP_FIN_WAIT1, _TCP_FIN_WAIT2, _TCP_CLOSE_WAIT, _TCP_LAST_ACK, _TCP_CLOSING = 1, 2, 4, 5, 8, 9, 11
CONNECTED_STATES = sum(1 << s for s in (_TCP_ESTABLISHED, _TCP_SYN_SENT, _TCP_FIN_WAIT1, _TCP_FIN_WAIT2,
                                         _TCP_CLOSE_WAIT, _TCP_LAST_ACK, _TCP_CLOSING))

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQ_V2 = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states; then the 48-byte socket id
_SOCKID_LEN = 48  # sport, dport (be16), src[16], dst[16], if (u32), cookie (2 x u32)
_DIAG_MSG_HEAD = 4  # family, state, timer, retrans; then the socket id
_NLATTR = struct.Struct("=HH")
_BC_OP = struct.Struct("=BBH")  # code, yes, no
_HOSTCOND = struct.Struct("=BBxxi")  # family, prefix_len, (pad), port

_libc = ct.CDLL(None, use_errno=True)


class SockDestroyError(OSError):
    """The kernel refused the dump or a destroy (the message names the backend and why)."""


def end_tcp_to(backend: Endpoint, netns: str | None = None) -> int:
    """Abort every connected TCP socket whose peer is `backend`, in network namespace
    `netns` (a name under /run/netns; None: this process's own). Returns how many ended."""
    return end_tcp_to_many([backend], netns)[backend]


def end_tcp_to_many(backends: Sequence[Endpoint], netns: str | None = None) -> dict[Endpoint, int]:
    """`end_tcp_to` for several backends at once: the kernel walks its socket table once per
    address family whatever their number (the walk is most of the cost, ~0.15 ms on a
    262,144-bucket table), its filter matching any of them. Returns the count per backend."""
    wanted = list(dict.fromkeys(backends))
    if len(wanted) > MAX_BATCH:
        counts: dict[Endpoint, int] = {}
        for i in range(0, len(wanted), MAX_BATCH):
            counts.update(end_tcp_to_many(wanted[i:i + MAX_BATCH], netns))
        return counts
    counts = dict.fromkeys(wanted, 0)
    if not wanted:
        return counts
    with _diag_socket(netns) as sock:
        found: list[tuple[int, bytes, Endpoint]] = []
        v4 = [b for b in wanted if b.is_ipv4]
        if v4:
            found.extend(_dump(sock, v4, socket.AF_INET, 1))
        found.extend(_dump(sock, wanted, socket.AF_INET6, 2))  # dual-stack sockets to ::ffff:a.b.c.d, and IPv6
        for backend, n in _destroy(sock, [f for f in found if f[2] in counts]).items():
            counts[backend] += n
        return counts


def end_tcp_by_cookie(cookies: Collection[int], netns: str | None = None) -> int:
    """Abort the connected TCP sockets whose kernel cookies (`bpf_get_socket_cookie`'s, the
    ones the connect hooks note for each connect they rewrite) are in `cookies`, in
    `netns`. One dump of the namespace's connected sockets per family, each socket known by
    its cookie, then a destroy for each match. Returns how many ended."""
    wanted = set(cookies)
    if not wanted:
        return 0
    with _diag_socket(netns) as sock:
        found = [f for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1)
                 for f in _dump(sock, None, family, seq) if _cookie(f[1]) in wanted]
        return sum(_destroy(sock, found).values())


def _destroy(sock: socket.socket, found: Sequence[tuple[int, bytes, Endpoint]]) -> dict[Endpoint, int]:
    """SOCK_DESTROY each (family, socket id, peer), all in one message; ended per peer."""
    ended: dict[Endpoint, int] = {}
    if not found:
        return ended
    base = 100
    sock.sendall(b"".join(_destroy_msg(family, sock_id, base + i) for i, (family, sock_id, _) in enumerate(found)))
    for seq, err in _acks(sock, len(found)):
        peer = found[seq - base][2]
        if err == 0:
            ended[peer] = ended.get(peer, 0) + 1
        elif err not in (errno.ENOENT, errno.ESRCH):  # gone since the dump: it ended on its own
            raise SockDestroyError(err, f"ending a connection to {peer}: {os.strerror(err)}")
    return ended


def _cookie(sock_id: bytes) -> int:
    low, high = struct.unpack_from("=II", sock_id, 40)  # idiag_cookie[2], as sock_gen_cookie splits it
    return low | high << 32


@contextmanager
def _diag_socket(netns: str | None) -> Iterator[socket.socket]:
    """A sock_diag netlink socket in `netns`: made with this thread switched into the
    namespace and back (a netlink socket stays in the namespace it was made in)."""
    if netns is None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    else:
        sock = _in_netns(netns)
    try:
        sock.bind((0, 0))
        yield sock
    finally:
        sock.close()


def _in_netns(netns: str) -> socket.socket:
    try:
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SockDestroyError(exc.errno, f"network namespace `{netns}`: {exc.strerror}") from exc
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target, netns)
        try:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        finally:
            _setns(home, "this process's own")
    finally:
        os.close(target)
        os.close(home)


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ct.get_errno()
        raise SockDestroyError(err, f"entering network namespace {what}: {os.strerror(err)}")


def _cond(backend: Endpoint) -> tuple[int, int, bytes]:
    if backend.is_ipv4:
        return socket.AF_INET, 32, socket.inet_pton(socket.AF_INET, backend.host)
    return socket.AF_INET6, 128, socket.inet_pton(socket.AF_INET6, backend.host)


def _dst_filter(backends: Sequence[Endpoint]) -> bytes:
    """inet_diag bytecode accepting a socket whose destination (address and port) is any of
    `backends`: a D_COND op per backend; a match falls on a JMP to the end (accept), a miss
    skips it to the next D_COND, and the last miss jumps past the end (reject)."""
    conds = []
    for b in backends:
        family, plen, addr = _cond(b)
        conds.append((_HOSTCOND.pack(family, plen, b.port) + addr))
    sizes = [_BC_OP.size + len(c) for c in conds]
    total = sum(sizes) + _BC_OP.size * (len(conds) - 1)
    out = bytearray()
    for i, (c, size) in enumerate(zip(conds, sizes)):
        last = i == len(conds) - 1
        out += _BC_OP.pack(INET_DIAG_BC_D_COND, size, size + 4) + c
        if not last:
            out += _BC_OP.pack(INET_DIAG_BC_JMP, _BC_OP.size, total - len(out))
    return bytes(out)


def _dump(sock: socket.socket, backends: Sequence[Endpoint] | None, family: int, seq: int) -> list[tuple[int, bytes, Endpoint]]:
    """(family, socket id, its peer) of each connected socket going to one of `backends`
    (None: every connected socket)."""
    bc = _dst_filter(backends) if backends is not None else b""
    attr = _NLATTR.pack(_NLATTR.size + len(bc), INET_DIAG_REQ_BYTECODE) + bc if bc else b""
    body = _REQ_V2.pack(family, socket.IPPROTO_TCP, 0, 0, CONNECTED_STATES) + b"\x00" * _SOCKID_LEN + attr
    sock.sendall(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
    found: list[tuple[int, bytes, Endpoint]] = []
    while True:
        data = sock.recv(65536)
        for mtype, payload in _messages(data):
            if mtype == NLMSG_DONE:
                return found
            if mtype == NLMSG_ERROR:
                err = -struct.unpack_from("=i", payload)[0]
                if err == 0:
                    continue
                what = "connections" if backends is None else \
                    f"connections to {', '.join(map(str, backends[:3]))}{' ...' if len(backends) > 3 else ''}"
                raise SockDestroyError(err, f"listing {what}: {os.strerror(err)}")
            if mtype == SOCK_DIAG_BY_FAMILY:
                sock_id = bytes(payload[_DIAG_MSG_HEAD:_DIAG_MSG_HEAD + _SOCKID_LEN])
                found.append((payload[0], sock_id, _peer(payload[0], sock_id)))


def _peer(family: int, sock_id: bytes) -> Endpoint:
    dport = int.from_bytes(sock_id[2:4], "big")
    raw = sock_id[20:36]
    if family == socket.AF_INET:
        raw = b"\x00" * 10 + b"\xff\xff" + raw[:4]
    return Endpoint.from_packed16(raw, dport)


def _destroy_msg(family: int, sock_id: bytes, seq: int) -> bytes:
    body = _REQ_V2.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sock_id
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body


def _acks(sock: socket.socket, n: int) -> Iterator[tuple[int, int]]:
    """(sequence number, errno) of the next `n` acknowledgements."""
    seen = 0
    while seen < n:
        for mtype, payload, seq in _messages_seq(sock.recv(65536)):
            if mtype == NLMSG_ERROR:
                seen += 1
                yield seq, -struct.unpack_from("=i", payload)[0]


def _messages(data: bytes) -> Iterator[tuple[int, memoryview]]:
    for mtype, payload, _ in _messages_seq(data):
        yield mtype, payload


def _messages_seq(data: bytes) -> Iterator[tuple[int, memoryview, int]]:
    view = memoryview(data)
    off = 0
    while off + _NLMSGHDR.size <= len(view):
        length, mtype, _flags, seq, _pid = _NLMSGHDR.unpack_from(view, off)
        if length < _NLMSGHDR.size:
            return
        yield mtype, view[off + _NLMSGHDR.size:off + length], seq
        off += (length + 3) & ~3
