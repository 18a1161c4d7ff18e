"""The local host as a telemetry source: NUMA nodes, CPUs and memory from
`/sys/devices/system/node`, NICs from `/sys/class/net`, RDMA ports from
`/sys/class/infiniband` when present, GPUs from NVML when present.

The host's uplink is modelled as one switch behind an ingress ("ingress/local"), so the
same placer code runs on one machine. NIC utilisation is the byte-counter delta between
samples over the link speed; a NIC whose speed the kernel does not report is assumed to
run at 10 Gb/s, and the frame's notes say so.
"""

from __future__ import annotations

import glob
import os
import time

import numpy as np

from .nvml import NvmlSource
from .telemetry import TelemetryFrame
from .topology import FabricLink, GpuInfo, HostInfo, NodeKind, NumaInfo, PortInfo, StoreKind, Topology

DEFAULT_SPEED = 10e9 / 8  # bytes/s when /sys does not say
NIC_BUFFER = 4e6


def parse_cpulist(text: str) -> tuple[int, ...]:
    """`0-3,8,10-11` -> (0, 1, 2, 3, 8, 10, 11)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return tuple(out)


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _int(path: str, default: int) -> int:
    try:
        return int(_read(path, str(default)))
    except ValueError:
        return default


class LocalHostSource:
    """A `TelemetrySource` for this machine. `sys_root` lets tests point it at a fake tree."""

    name = "localhost"

    def __init__(self, sys_root: str = "/sys", nvml: NvmlSource | None = None, region: str = "local",
                 hostname: str | None = None) -> None:
        self._sys = sys_root
        self._nvml = nvml
        self._notes: list[str] = []
        if nvml is not None and not nvml.available:
            self._notes.append(nvml.reason)
        host = hostname or os.uname().nodename
        numa = self._numa_nodes()
        nodes = ("ingress/local", "local-uplink")
        kinds = (NodeKind.INGRESS, NodeKind.LEAF)
        links = (FabricLink(0, 1, 20e-6, 12.5e9),)
        node_ids = [n for n, _ in numa]
        numa_infos = tuple(NumaInfo(0, n, cpus, StoreKind.HOST_MEMORY) for n, cpus in numa)
        self._nics = self._nics_found(node_ids)
        ports = tuple(PortInfo(0, node_ids.index(nn), name, 1, speed, NIC_BUFFER, rdma) for name, _, nn, speed, rdma in self._nics)
        self._gpus = nvml.readings() if nvml is not None else ()
        gpus = tuple(GpuInfo(0, node_ids.index(r.numa_node) if r.numa_node in node_ids else 0, f"gpu{r.index}", r.gpu_class)
                     for r in self._gpus)
        tee = os.path.exists("/dev/sev-guest") or os.path.exists("/dev/tdx_guest")
        cuda = nvml.cuda_version() if nvml is not None and nvml.available else None  # NVML's, as the host's agent reads it
        hosts = (HostInfo(host, region, tpm=bool(glob.glob(os.path.join(sys_root, "class/tpm/tpm*"))),
                          memory_encryption=tee, hardware_firewall=False, tee=tee, **({"cuda": cuda} if cuda else {}),
                          addresses=self._addresses(sys_root)),)
        self._topology = Topology(1, hosts, numa_infos, gpus, ports, nodes, kinds, links, (), {region: 0})
        self._tick = 0
        self._last: tuple[float, list[float]] | None = None
        if not ports:
            self._notes.append("no network interface found under /sys/class/net: GPUs have no path")

    def topology(self) -> Topology:
        return self._topology

    @staticmethod
    def _addresses(sys_root: str) -> tuple[str, ...]:
        """This machine's IP addresses (loopback included): IPv4 from the kernel's FIB
        (`/proc/net/fib_trie`'s host routes), IPv6 from `/proc/net/if_inet6`. Read from
        /proc, not `sys_root`: a test's fake /sys has no addresses of its own."""
        import ipaddress

        out: list[str] = []
        try:
            with open("/proc/net/fib_trie", encoding="ascii") as f:
                lines = f.read().splitlines()
            for prev, line in zip(lines, lines[1:]):
                if "/32 host LOCAL" in line:
                    ip = prev.strip().split()[-1]
                    if ip not in out:
                        out.append(ip)
        except OSError:
            pass
        try:
            with open("/proc/net/if_inet6", encoding="ascii") as f:
                for line in f:
                    raw = line.split()[0]
                    ip = str(ipaddress.IPv6Address(int(raw, 16)))
                    if ip not in out:
                        out.append(ip)
        except (OSError, ValueError, IndexError):
            pass
        return tuple(out) or ("127.0.0.1", "::1")

    def sample(self) -> TelemetryFrame:
        self._tick += 1
        t = self._topology
        f = TelemetryFrame.empty(t, self._tick, tuple(self._notes))
        now = time.monotonic()
        counters = [self._bytes(path) for _, path, _, _, _ in self._nics]
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            rate = np.array([max(0.0, c - p) for c, p in zip(counters, self._last[1])]) / dt
            f.port_util[:] = np.clip(rate / t.port_bandwidth, 0.0, 1.0) if len(rate) else 0.0
        self._last = (now, counters)
        for i, (_name, path, _, _, rdma) in enumerate(self._nics):
            state = _read(os.path.join(path, "operstate" if not rdma else "state"), "up").lower()
            f.port_up[i] = ("up" in state) or ("active" in state) or state == "unknown"
        for i, n in enumerate(t.numa):
            f.numa_mem_free[i] = self._mem_free(n.node)
        if self._nvml is not None and self._gpus:
            readings = self._nvml.readings()
            for i, r in enumerate(readings[: len(t.gpus)]):
                f.gpu_sm_util[i], f.gpu_mem_free[i], f.gpu_pcie_util[i], f.gpu_health[i] = r.sm_util, r.mem_free, r.pcie_util, r.health
        return f

    # ------------------------------------------------------------------ /sys readers

    def _numa_nodes(self) -> list[tuple[int, tuple[int, ...]]]:
        base = os.path.join(self._sys, "devices/system/node")
        found = []
        for d in sorted(glob.glob(os.path.join(base, "node[0-9]*"))):
            n = int(os.path.basename(d)[4:])
            found.append((n, parse_cpulist(_read(os.path.join(d, "cpulist")))))
        if not found:
            self._notes.append(f"no NUMA information under {base}: one node with every CPU assumed")
            found.append((0, tuple(range(os.cpu_count() or 1))))
        return sorted(found)

    def _mem_free(self, node: int) -> float:
        text = _read(os.path.join(self._sys, f"devices/system/node/node{node}/meminfo"))
        for line in text.splitlines():
            if "MemFree:" in line:
                return float(line.split("MemFree:")[1].split()[0]) * 1024.0
        return 0.0

    def _nics_found(self, node_ids: list[int]) -> list[tuple[str, str, int, float, bool]]:
        """(name, counter dir, NUMA node, bytes/s, rdma) per NIC and RDMA port."""
        out = []
        for d in sorted(glob.glob(os.path.join(self._sys, "class/net/*"))):
            name = os.path.basename(d)
            if name == "lo":
                continue
            numa = _int(os.path.join(d, "device/numa_node"), 0)
            speed = _int(os.path.join(d, "speed"), -1)
            if speed <= 0:
                self._notes.append(f"{name}: link speed unknown, 10 Gb/s assumed")
            out.append((name, d, numa if numa in node_ids else node_ids[0], speed * 1e6 / 8 if speed > 0 else DEFAULT_SPEED, False))
        for d in sorted(glob.glob(os.path.join(self._sys, "class/infiniband/*/ports/*"))):
            dev = d.split(os.sep)[-3]
            numa = _int(os.path.join(self._sys, "class/infiniband", dev, "device/numa_node"), 0)
            rate = _read(os.path.join(d, "rate"), "")  # "100 Gb/sec (4X EDR)"
            try:
                bps = float(rate.split()[0]) * 1e9 / 8
            except (ValueError, IndexError):
                bps = DEFAULT_SPEED
            out.append((f"{dev}:{os.path.basename(d)}", d, numa if numa in node_ids else node_ids[0], bps, True))
        return out

    @staticmethod
    def _bytes(path: str) -> float:
        if os.path.isdir(os.path.join(path, "statistics")):
            return float(_int(os.path.join(path, "statistics/rx_bytes"), 0) + _int(os.path.join(path, "statistics/tx_bytes"), 0))
        # infiniband counters count 4-byte words
        return 4.0 * (_int(os.path.join(path, "counters/port_rcv_data"), 0) + _int(os.path.join(path, "counters/port_xmit_data"), 0))
