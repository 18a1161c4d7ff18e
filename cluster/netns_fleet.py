"""Several hosts on one machine: each a Linux network namespace with its own interface and
address, joined by a bridge in the root namespace (the switch). For tests and for trying
agents out; needs root and iproute2.

    fleet = NetnsFleet.create(["host-0002", "host-0005"])
    fleet.hosts["host-0002"].address          # e.g. 10.213.7.10, on its eth0
    proc = fleet.popen("host-0002", ["policyc", "agent", "run", …])   # runs inside that host
    fleet.shape_uplink("host-0002", spare_dports=[2379])   # a congested port (tc), its queue the agent's backlog
    fleet.destroy()

The root namespace has the bridge's address (`fleet.gateway`), so processes there (etcd,
the decision service, Envoy) reach every host and every host reaches them.
"""

from __future__ import annotations

import ipaddress
import os
import random
import subprocess
from dataclasses import dataclass, field
from typing import Any, Sequence


class NetnsError(RuntimeError):
    pass


def _ip(*args: str) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


@dataclass(frozen=True)
class NsHost:
    name: str
    netns: str
    address: str  # on its eth0, in the fleet's /24
    veth: str  # its cable's end in the root namespace, a port of the bridge


@dataclass
class NetnsFleet:
    bridge: str
    network: ipaddress.IPv4Network
    hosts: dict[str, NsHost] = field(default_factory=dict)

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge."""
        return str(self.network.network_address + 1)

    @classmethod
    def create(cls, names: Sequence[str], *, network: str | None = None) -> "NetnsFleet":
        if os.geteuid() != 0:
            raise NetnsError("network namespaces need root")
        token = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
        net = ipaddress.ip_network(network) if network else _free_network()
        if not isinstance(net, ipaddress.IPv4Network) or net.num_addresses < len(names) + 12:
            raise NetnsError(f"network {net}: an IPv4 network with room for {len(names)} hosts is required")
        fleet = cls(f"pcb{token}", net)
        try:
            _ip("link", "add", fleet.bridge, "type", "bridge")
            _ip("addr", "add", f"{fleet.gateway}/{net.prefixlen}", "dev", fleet.bridge)
            _ip("link", "set", fleet.bridge, "up")
            for i, name in enumerate(names):
                fleet._add(name, i, token)
        except Exception:
            fleet.destroy()
            raise
        return fleet

    def _add(self, name: str, i: int, token: str) -> None:
        ns, veth, peer = f"pc{token}-{i}", f"pv{token}{i}", f"pn{token}{i}"
        address = str(self.network.network_address + 10 + i)
        _ip("netns", "add", ns)
        self.hosts[name] = NsHost(name, ns, address, veth)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("-n", ns, "link", "set", peer, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{address}/{self.network.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")

    def popen(self, host: str, argv: Sequence[str], **kw: Any) -> "subprocess.Popen[Any]":
        """Run `argv` inside `host`'s namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.hosts[host].netns, *argv], **kw)

    def run(self, host: str, argv: Sequence[str], **kw: Any) -> "subprocess.CompletedProcess[Any]":
        return subprocess.run(["ip", "netns", "exec", self.hosts[host].netns, *argv], **kw)

    def add_link(self, host: str, name: str = "data0") -> str:
        """A second cable for `host`: `name` in its namespace (up, no address), its peer a port
        of the bridge, so the host's etcd traffic stays on eth0 as management traffic on its
        own network; returns the peer's name in the root namespace (it goes with the fleet)."""
        ns = self.hosts[host].netns
        peer = f"pd{ns[-6:].replace('-', '')}"
        for argv in (["link", "add", peer, "type", "veth", "peer", "name", f"{peer}n"], ["link", "set", f"{peer}n", "netns", ns],
                     ["-n", ns, "link", "set", f"{peer}n", "name", name], ["-n", ns, "link", "set", name, "up"],
                     ["link", "set", peer, "master", self.bridge], ["link", "set", peer, "up"]):
            _ip(*argv)
        return peer

    def set_link(self, host: str, name: str, *, up: bool) -> None:
        """Take `host`'s interface `name` down (a failed link) or up, inside its namespace."""
        _ip("-n", self.hosts[host].netns, "link", "set", name, "up" if up else "down")

    def shape_uplink(self, host: str, *, rate: str = "1mbit", queue_bytes: int = 100_000,
                     spare_dports: Sequence[int] = ()) -> None:
        """A congested port: `host`'s eth0 egress shaped to `rate` (HTB) behind a byte fifo of
        `queue_bytes`, so traffic beyond the rate queues there (the backlog its agent measures).
        Traffic to `spare_dports` (the control plane: the agent's etcd) gets its own
        unshaped class, so the host stays reachable for what reports the congestion."""
        steps = [["qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb", "default", "20", "r2q", "1000"],
                 ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "100mbit"],
                 ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", rate, "ceil", rate],
                 ["qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "bfifo", "limit", str(queue_bytes)]]
        steps += [["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip", "dport",
                   str(p), "0xffff", "flowid", "1:10"] for p in spare_dports]
        for argv in steps:
            out = self.run(host, ["tc", *argv], capture_output=True, text=True, timeout=20)
            if out.returncode != 0:
                self.unshape_uplink(host)
                raise NetnsError(f"{host}: tc {' '.join(argv)}: {out.stderr.strip() or out.returncode}")

    def unshape_uplink(self, host: str) -> None:
        """Back to the default qdisc on `host`'s eth0 (nothing to undo is not an error)."""
        self.run(host, ["tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True, timeout=20)

    def destroy(self) -> None:
        for h in self.hosts.values():
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True, timeout=20)
            subprocess.run(["ip", "link", "del", h.veth], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=20)
        self.hosts.clear()


def _free_network() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no route of this machine touches."""
    used = []
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        dst = line.split()[0] if line else ""
        if dst[:1].isdigit():
            try:
                used.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randrange(200, 208)}.{random.randrange(256)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net  # type: ignore[return-value]
    raise NetnsError("no free /24 in 10.200.0.0/13 for the namespace fleet")
