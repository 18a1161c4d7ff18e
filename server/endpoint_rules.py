"""Where a registered instance's endpoint may point: the rule table, once, as data.

A gateway dials the `deployment.endpoint` of the instance it picks, so an endpoint is an
instruction to connect: registered at the gateway's own Envoy admin port it made the
public listener a proxy to `/quitquitquit`; at `169.254.169.254:80` a proxy to the cloud's
credentials; anywhere else on the machine, a way to answer finance traffic with any process
under a hardened host's facts. `RegisterInstance` refuses an endpoint that breaks a rule of
`RULES` (first match), naming the rule (`ErrorInfo.metadata["rule"]`, and in the message):

| rule | refuses |
| --- | --- |
| `unspecified-address` | 0.0.0.0 and :: (a dial to them reaches this machine) |
| `multicast-address` | 224.0.0.0/4, ff00::/8 |
| `cloud-metadata-address` | the metadata services' addresses (169.254.169.254, fd00:ec2::254, 100.100.100.200, 169.254.170.2) |
| `link-local-address` | 169.254.0.0/16, fe80::/10 |
| `gateway-own-port` | this machine's addresses (loopback included) at a port of the service's own: the decision API, metrics, and with a gateway Envoy's listener and admin, the picker, the access-log receiver |
| `outside-allowed-networks` | an address outside the operator's `--endpoint-network CIDR` list (default: the topology's hosts' addresses) |
| `not-the-claimed-host` | an address that is not one of the claimed host's, as the topology source knows them (`HostInfo.addresses`) or the operator declares them (`--host-address HOST=IP`) |

An IPv4-mapped IPv6 address (`::ffff:169.254.169.254`) is judged as the IPv4 address it maps.
The host rule is what the topology source knows today; the node agent binds it
cryptographically (an attested host signs its own endpoints).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Callable, Iterable

from policyc.placer.topology import Topology

from .errors import ServiceError, Status

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200",
                                                       "169.254.170.2", "169.254.170.23"))
CODE = "E725"  # compiler/codes.py: an endpoint a registration may not name


@dataclass
class EndpointCheck:
    """What one endpoint is judged against: the service's own ports, the operator's networks
    (None: the topology's hosts' addresses), the topology and the claimed host."""

    reserved: dict[int, str]
    networks: tuple[Network, ...] | None
    topology: Topology | None
    host: str
    declared: dict[str, frozenset[IP]] = field(default_factory=dict)  # the operator's `--host-address`
    _owners: dict[IP, str] = field(default_factory=dict)

    def owners(self) -> dict[IP, str]:
        """address → the topology host that has it (the first, for loopback shared by the
        simulated hosts)."""
        if not self._owners:
            for name, ips in self.declared.items():
                for ip in ips:
                    self._owners.setdefault(ip, name)
            for h in self.topology.hosts if self.topology is not None else ():
                for a in h.addresses:
                    self._owners.setdefault(_plain(ipaddress.ip_address(a)), h.name)
        return self._owners

    def host_addresses(self) -> frozenset[IP]:
        known = self.declared.get(self.host, frozenset())
        if self.topology is None:
            return known
        i = self.topology.host_index.get(self.host)
        if i is None:
            return known
        return known | frozenset(_plain(ipaddress.ip_address(a)) for a in self.topology.hosts[i].addresses)


@dataclass(frozen=True)
class EndpointRule:
    name: str
    refuses: str  # what the rule is for, one line (said in the refusal)
    status: Status
    breaks: Callable[[EndpointCheck, IP, int], str | None]  # the particular problem, or None: passes


def _plain(ip: IP) -> IP:
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None else ip


def is_this_machine(ip: IP) -> bool:
    """Loopback, or an address assigned to this machine (binding to it succeeds only then)."""
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:
        return False


def _own_port(c: EndpointCheck, ip: IP, port: int) -> str | None:
    what = c.reserved.get(port)
    if what is not None and is_this_machine(ip):
        return f"port {port} is {what} on this machine"
    return None


def _outside(c: EndpointCheck, ip: IP, port: int) -> str | None:
    if c.networks is not None:
        if not any(ip in n for n in c.networks if n.version == ip.version):
            return f"{ip} is in none of {', '.join(str(n) for n in c.networks[:8])}"
        return None
    if ip not in c.owners():
        hosts = len(c.topology.hosts) if c.topology else 0
        return f"{ip} is no address of the topology's {hosts} hosts (give --endpoint-network CIDR to allow other networks)"
    return None


def _not_claimed(c: EndpointCheck, ip: IP, port: int) -> str | None:
    mine = c.host_addresses()
    if ip in mine:
        return None
    if not mine:
        return f"the topology knows no address of host `{c.host}`"
    other = c.owners().get(ip)
    shown = ", ".join(sorted(str(a) for a in mine)[:6])
    return (f"{ip} is host `{other}`'s, not `{c.host}`'s" if other is not None and other != c.host
            else f"{ip} is not an address of host `{c.host}`") + f" (its addresses: {shown})"


RULES: tuple[EndpointRule, ...] = (
    EndpointRule("unspecified-address", "0.0.0.0 and :: name no host: a dial to them reaches this machine", Status.INVALID_ARGUMENT,
                 lambda c, ip, port: "the unspecified address" if ip.is_unspecified else None),
    EndpointRule("multicast-address", "a multicast address names no one server", Status.INVALID_ARGUMENT,
                 lambda c, ip, port: "a multicast address" if ip.is_multicast else None),
    EndpointRule("cloud-metadata-address", "a cloud's instance metadata service hands out its credentials",
                 Status.INVALID_ARGUMENT, lambda c, ip, port: "a metadata service's address" if ip in METADATA else None),
    EndpointRule("link-local-address", "link-local addresses, 169.254.0.0/16 and fe80::/10, are not routed: metadata "
                 "services live there", Status.INVALID_ARGUMENT,
                 lambda c, ip, port: "a link-local address" if ip.is_link_local else None),
    EndpointRule("gateway-own-port", "the service's own ports are not model servers: the decision API, metrics, Envoy's "
                 "listener and admin, the picker, the access log", Status.PERMISSION_DENIED, _own_port),
    EndpointRule("outside-allowed-networks", "endpoints must lie in the allowed networks, by default the topology's hosts' addresses", Status.PERMISSION_DENIED, _outside),
    EndpointRule("not-the-claimed-host", "an endpoint must be an address of the host whose facts it claims",
                 Status.FAILED_PRECONDITION, _not_claimed),
)


def parse_host_addresses(specs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`--host-address HOST=IP` values, or ValueError naming the bad one."""
    out: list[tuple[str, str]] = []
    for s in specs:
        host, sep, ip = s.partition("=")
        try:
            if not sep or not host.strip():
                raise ValueError
            out.append((host.strip(), str(_plain(ipaddress.ip_address(ip.strip())))))
        except ValueError:
            raise ValueError(f"--host-address `{s[:60]}`: expected HOST=IP, e.g. gpu-node-7=10.0.3.7") from None
    return tuple(out)


def parse_networks(specs: Iterable[str]) -> tuple[Network, ...]:
    """`--endpoint-network` values as networks, or ValueError naming the bad one."""
    out: list[Network] = []
    for s in specs:
        try:
            out.append(ipaddress.ip_network(s.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--endpoint-network `{s[:60]}`: not a network (CIDR, e.g. 10.0.0.0/8 or fd00::/8)") from None
    return tuple(out)


def _split(endpoint: str) -> tuple[IP, int] | None:
    """`ip:port` or `[ip6]:port` leniently; None when it is not one (its syntax is refused elsewhere)."""
    host, sep, port = endpoint[1:].partition("]:") if endpoint.startswith("[") else endpoint.rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        return _plain(ipaddress.ip_address(host)), int(port)
    except ValueError:
        return None


class EndpointRules:
    """The service's endpoint policy: its reserved ports (the gateway adds its own) and the
    operator's networks; `check` refuses an endpoint that breaks a rule."""

    def __init__(self, networks: tuple[Network, ...] = (), rules: tuple[EndpointRule, ...] = RULES,
                 host_addresses: Iterable[tuple[str, str]] = ()) -> None:
        self.networks = networks or None
        self.reserved: dict[int, str] = {}
        self.rules = rules
        self.declared: dict[str, frozenset[IP]] = {}
        for host, ip in host_addresses:
            self.declare(host, ip)

    def declare(self, host: str, address: str) -> None:
        """`address` is one of `host`'s, beside what the topology source knows (an operator's
        site inventory: `--host-address HOST=IP`)."""
        ip = _plain(ipaddress.ip_address(address))
        self.declared[host] = self.declared.get(host, frozenset()) | {ip}

    def reserve(self, port: int | None, what: str) -> None:
        """`port` on this machine is `what` of the service's own: never an instance's endpoint."""
        if port:
            self.reserved.setdefault(port, what)

    def check(self, instance_id: str, endpoint: str, host: str, topology: Topology | None) -> None:
        """Raise ServiceError naming the first rule `endpoint` breaks (nothing when empty)."""
        if not endpoint:
            return
        parsed = _split(endpoint)
        if parsed is None:
            return  # not `ip:port`: the registration's syntax check says so
        ip, port = parsed
        c = EndpointCheck(self.reserved, self.networks, topology, host, self.declared)
        for rule in self.rules:
            why = rule.breaks(c, ip, port)
            if why is not None:
                f = "deployment.endpoint"
                message = f"instance `{instance_id}`: `{f}` `{endpoint}` refused by rule `{rule.name}`: {why}; {rule.refuses}"
                raise ServiceError(rule.status, message, (f"{f}: rule `{rule.name}`: {why}",), field=f, code=CODE,
                                   info={"rule": rule.name})
