"""What a host agent discovers about its own host: each interface (name, MAC, MTU, state,
link speed where the driver says) and the addresses on it, read from the kernel (rtnetlink
through pyroute2, and `/sys/class/net/<if>/speed`) in the network namespace the agent runs
in; and its hardware and site facts (GPUs, CUDA, NUMA, RDMA, NVMe, TPM / SEV-SNP / TDX,
region, zone, hardware firewall: `host_hardware.py`), each with its source. The addresses
are those the host's model servers may answer on: a replica takes them as the host's own
(`Replica` declares them to the endpoint rules), so an instance claiming this host with an
endpoint on another host's address is refused; and an instance whose claims contradict the
hardware facts is refused (`host_claims.py`).

    facts = discover("host-3")
    facts.routable()          # {"10.0.3.7", "fd00::7"}: no loopback, no link-local
"""

from __future__ import annotations

import ipaddress
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .host_hardware import Hardware, Site, discover_hardware

SOURCE = "rtnetlink (pyroute2) in the agent's network namespace; link speed from /sys/class/net"


@dataclass(frozen=True)
class Interface:
    name: str
    mac: str
    mtu: int
    state: str  # the kernel's operstate: UP, DOWN, UNKNOWN (loopback), …
    speed_mbps: int | None  # None: the driver does not say (veth, loopback, a link that is down)
    addresses: tuple[str, ...]  # CIDR, e.g. 10.0.3.7/24


@dataclass(frozen=True)
class HostFacts:
    host: str
    interfaces: tuple[Interface, ...]
    source: str = SOURCE
    hardware: Hardware | None = None  # None: an agent that did not read them (facts of interfaces only)
    report_key: str = ""  # the Ed25519 key its signal reports are signed with (hex; `signed_reports.py`), "" when unsigned

    def routable(self) -> set[str]:
        """The host's addresses another host can reach: not loopback, not link-local."""
        out = set()
        for i in self.interfaces:
            for a in i.addresses:
                ip = ipaddress.ip_interface(a).ip
                if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast):
                    out.add(str(ip))
        return out

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "host": self.host, "source": self.source,
            "interfaces": [{"name": i.name, "mac": i.mac, "mtu": i.mtu, "state": i.state, "speed_mbps": i.speed_mbps,
                            "addresses": list(i.addresses)} for i in self.interfaces]}
        if self.hardware is not None:
            out["hardware"] = self.hardware.to_json()
        if self.report_key:
            out["report_key"] = self.report_key
        return out

    def with_interfaces(self, now: "HostFacts") -> "HostFacts":
        """These facts with `now`'s interfaces (rediscovery reads the network only: the
        hardware does not change under a running agent)."""
        return dataclasses.replace(self, interfaces=now.interfaces)

    @classmethod
    def from_json(cls, body: dict[str, object]) -> "HostFacts":
        """ValueError for a record that is not one (bounded: at most 256 interfaces, 64 addresses each)."""
        try:
            raw = body["interfaces"]
            if not isinstance(raw, list) or len(raw) > 256:
                raise ValueError("interfaces: a list of at most 256")
            ifs = []
            for i in raw:
                addrs = tuple(str(ipaddress.ip_interface(str(a))) for a in list(i["addresses"])[:64])
                speed = i.get("speed_mbps")
                ifs.append(Interface(str(i["name"]), str(i["mac"]), int(i["mtu"]), str(i["state"]),
                                     None if speed is None else int(speed), addrs))
            hw = Hardware.from_json(body["hardware"]) if body.get("hardware") is not None else None
            return cls(str(body["host"]), tuple(ifs), str(body.get("source") or SOURCE), hw, str(body.get("report_key") or "")[:128])
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a host facts record ({e})") from None


def _speed(name: str) -> int | None:
    try:
        v = int((Path("/sys/class/net") / name / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return v if v > 0 else None


def discover(host: str, site: Site | None = None, *, hardware: bool = False, sys_root: str = "/sys") -> HostFacts:
    """The interfaces and addresses of the network namespace this process runs in; with
    `hardware`, also the host's hardware and the operator's `site` facts."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        links = ipr.get_links()
        addrs = ipr.get_addr()
    by_index: dict[int, list[str]] = {}
    for a in addrs:
        ip = a.get_attr("IFA_ADDRESS")
        if ip:
            by_index.setdefault(int(a["index"]), []).append(f"{ip}/{a['prefixlen']}")
    out = []
    for link in sorted(links, key=lambda x: int(x["index"])):
        name = str(link.get_attr("IFLA_IFNAME"))
        out.append(Interface(name, str(link.get_attr("IFLA_ADDRESS") or ""), int(link.get_attr("IFLA_MTU") or 0),
                             str(link.get_attr("IFLA_OPERSTATE") or "UNKNOWN"), _speed(name),
                             tuple(sorted(by_index.get(int(link["index"]), [])))))
    hw = discover_hardware(site or Site(), sys_root=sys_root) if hardware else None
    return HostFacts(host, tuple(out), hardware=hw)


def uplinks(facts: HostFacts) -> frozenset[str]:
    """The interfaces the host reaches the fleet through: those its default routes leave by,
    else those with a routable address (a namespace host on one subnet has no default
    route); never loopback, never an interface without an address (`ifb0`, a spare NIC)."""
    from pyroute2 import IPRoute

    names = {i.name for i in facts.interfaces}
    by_index: dict[int, str] = {}
    out: set[str] = set()
    with IPRoute() as ipr:
        for link in ipr.get_links():
            by_index[int(link["index"])] = str(link.get_attr("IFLA_IFNAME"))
        for family in (2, 10):  # AF_INET, AF_INET6
            for r in ipr.get_default_routes(family=family):
                oif = r.get_attr("RTA_OIF")
                if oif is not None and by_index.get(int(oif)) in names:
                    out.add(by_index[int(oif)])
    if not out:
        routable = facts.routable()
        out = {i.name for i in facts.interfaces if any(str(ipaddress.ip_interface(a).ip) in routable for a in i.addresses)}
    out.discard("lo")
    return frozenset(out)


def main() -> None:
    """`python -m policyc.cluster.host_facts HOST`: the facts as JSON (what `policyc agent facts` prints)."""
    import sys

    print(json.dumps(discover(sys.argv[1] if len(sys.argv) > 1 else "this-host", hardware=True).to_json(), indent=2))


if __name__ == "__main__":
    main()
