"""A backend address as the kernel plane keys it: 16 address bytes and a port.

IPv4 addresses are stored IPv4-mapped (::ffff:a.b.c.d) so that one map serves both the
`connect4` hook and the `connect6` hook that gRPC's dual-stack sockets go through.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

_V4_MAPPED = b"\x00" * 10 + b"\xff\xff"


class EndpointError(ValueError):
    """An address or port that cannot name a backend."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str  # canonical text: dotted quad for IPv4 (and IPv4-mapped), compressed IPv6
    port: int

    @staticmethod
    def parse(text: str) -> "Endpoint":
        """`127.0.0.1:50051`, `[::1]:50051` or `[::ffff:127.0.0.1]:50051`."""
        if text.startswith("["):
            host, sep, port = text[1:].partition("]:")
        else:
            host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise EndpointError(f"endpoint `{text}`: expected host:port")
        return Endpoint.of(host, int(port))

    @staticmethod
    def of(host: str, port: int) -> "Endpoint":
        try:
            ip = ipaddress.ip_address(host)
        except ValueError as exc:
            raise EndpointError(f"endpoint `{host}`: not an IP address") from exc
        if not 0 < port < 65536:
            raise EndpointError(f"endpoint `{host}:{port}`: port out of range")
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return Endpoint(str(ip), port)

    @property
    def is_ipv4(self) -> bool:
        return _version(self.host) == 4

    def packed16(self) -> bytes:
        """The 16 address bytes in network order, IPv4 mapped into IPv6."""
        return _packed16(self.host)

    @staticmethod
    def from_packed16(raw: bytes, port: int) -> "Endpoint":
        return Endpoint(_host_of(bytes(raw)), port)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}" if self.is_ipv4 else f"[{self.host}]:{self.port}"


# A fleet has few distinct backend addresses and the enforcer converts them on every map
# change and kernel event (ipaddress costs ~10 us a parse), so the conversions are memoised.
@functools.lru_cache(maxsize=65536)
def _version(host: str) -> int:
    return ipaddress.ip_address(host).version


@functools.lru_cache(maxsize=65536)
def _packed16(host: str) -> bytes:
    ip = ipaddress.ip_address(host)
    return _V4_MAPPED + ip.packed if ip.version == 4 else ip.packed


@functools.lru_cache(maxsize=65536)
def _host_of(raw16: bytes) -> str:
    ip = ipaddress.IPv6Address(raw16)
    return str(ip.ipv4_mapped) if ip.ipv4_mapped is not None else str(ip)
