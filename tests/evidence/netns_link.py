"""A slow network link for the evidence tests, made in the kernel: a network namespace
joined to the host by a veth pair, a `tbf` token bucket on the host end (the host-to-
namespace direction), and, where every packet must wait (a SYN, which no burst limit
delays), a standing queue in that bucket kept by a paced UDP sender: a congested link
whose packets queue `delay` seconds, as on a saturated uplink with a deep buffer.

This kernel has neither `sch_netem` nor `sch_fq`; `tbf` is there. A token bucket delays
only what overruns its burst, so a lone packet passes at once; behind a standing queue
of `delay x rate` bytes it waits `delay`, since the bucket drains at exactly `rate`.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from policyc.modelserver.specs import ServerSpec

FRAME = 1200 + 8 + 20 + 14  # a filler datagram's length as tbf counts it (payload, UDP, IPv4, Ethernet)


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


class VethLink:
    """`ns` joined to the host: the host end has `host_ip` on `host_if`, the namespace end `ns_ip`."""

    def __init__(self, prefix: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns, self.host_if, ns_if = f"{prefix}-{tag}", f"{prefix[:5]}{tag}", f"{prefix[:4]}c{tag}"
        octet = int(tag[:2], 16) % 250 + 2
        self.host_ip, self.ns_ip = f"10.249.{octet}.1", f"10.249.{octet}.2"
        sh("ip", "netns", "add", self.ns)
        try:
            sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", ns_if, "netns", self.ns)
            sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            sh("ip", "link", "set", self.host_if, "up")
            sh("ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", ns_if)
            sh("ip", "-n", self.ns, "link", "set", ns_if, "up")
            sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def shape(self, rate_bit: int, burst: int = 1600) -> None:
        """A token bucket on the host-to-namespace direction (queue up to 2 s, so nothing is dropped)."""
        sh("tc", "qdisc", "add", "dev", self.host_if, "root", "tbf", "rate", f"{rate_bit}bit", "burst", str(burst), "latency", "2s")

    def unshape(self) -> str:
        """Remove the bucket; returns its statistics (`tc -s qdisc`) as it was."""
        stats = subprocess.run(["tc", "-s", "qdisc", "show", "dev", self.host_if], capture_output=True, text=True).stdout
        subprocess.run(["tc", "qdisc", "del", "dev", self.host_if, "root"], capture_output=True)
        return stats

    def end_connections_to(self, port: int) -> None:
        """End every TCP connection to the namespace's `port` (the kernel's sock_destroy, `ss -K`)."""
        sh("ss", "-K", "dst", self.ns_ip, "dport", "=", str(port))

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


class StandingQueue:
    """Keeps `delay` seconds of filler queued in the link's bucket: `delay x rate` bytes at
    once, then exactly `rate` (paced against the clock, so the filler's backlog does not
    drift; the link's own traffic adds to it: about 10 ms per call at 2 Mbit/s)."""

    def __init__(self, link: VethLink, rate_bit: int, delay: float) -> None:
        self.link, self.rate, self.delay = link, rate_bit / 8, delay
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="standing-queue", daemon=True)

    def __enter__(self) -> StandingQueue:
        self._thread.start()
        time.sleep(self.delay + 0.2)  # the first filler has crossed: the queue stands
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            filler, to = b"\0" * (FRAME - 42), (self.link.ns_ip, 9)  # discard port
            t0, sent = time.monotonic(), 0
            while not self._stop.is_set():
                due = self.rate * (self.delay + time.monotonic() - t0)
                while sent < due:
                    u.sendto(filler, to)
                    sent += FRAME
                time.sleep(0.005)


@dataclass(frozen=True, slots=True)
class NetnsServerSpec(ServerSpec):
    """A model server run inside a network namespace (`ip netns exec`), listening on `host`."""

    netns: str = ""

    def argv(self, ready_file: Path) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *ServerSpec.argv(self, ready_file)]
