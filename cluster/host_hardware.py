"""What a host agent discovers about its host's hardware and site, each fact with its
source: the GPUs (class, memory, PCI bus, NUMA node) and the CUDA driver version from NVML,
the NUMA nodes and their CPUs from `/sys/devices/system/node`, the RDMA ports with their
state and rate from `/sys/class/infiniband`, the NVMe controllers (model, size) from
`/sys/class/nvme`, the presence of a TPM, SEV-SNP and TDX from `/dev`, `/sys/module` and
`/proc/cpuinfo`, and the operator's site facts (region, zone, hardware firewall) from the
agent's configuration (`[agent]` table or its flags).

A fact the host lacks is absent (`None`, or a feature not listed), never a default: a host
without NVML has no `gpus` and no `cuda`, so a registration's GPU claims are then judged by
the topology alone (`host_claims.py`), not against an invented value.

    hw = discover_hardware(site=Site(region="us-west", zone="us-west-2a"))
    hw.gpus          # (Gpu(index=0, gpu_class="H100", memory_bytes=85899345920, ...),) or None
    hw.sources       # {"gpus": "NVML (pynvml) nvmlDeviceGetName/…", "numa": "/sys/devices/system/node", …}
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

MAX_ITEMS = 256  # per list, in a record read back from the store


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str  # NVML's marketing name, "NVIDIA H100 80GB HBM3"
    gpu_class: str  # the catalog class (`placer.nvml.gpu_class`), what `deployment.gpu_model` names
    memory_bytes: int
    pci_bus_id: str
    numa_node: int | None  # None: the kernel does not say (no NUMA, or -1 in sysfs)

    @property
    def id(self) -> str:
        """The GPU's id within its host, as deployments name it (`gpu0`)."""
        return f"gpu{self.index}"


@dataclass(frozen=True)
class NumaNode:
    node: int
    cpus: str  # the kernel's cpulist, e.g. "0-15,32-47"


@dataclass(frozen=True)
class RdmaPort:
    device: str  # mlx5_0
    port: int
    state: str  # "ACTIVE", "DOWN", … (the kernel's `4: ACTIVE` without its number)
    rate: str  # "100 Gb/sec (4X EDR)"
    rate_gbps: float | None
    link_layer: str  # InfiniBand / Ethernet


@dataclass(frozen=True)
class Nvme:
    name: str  # nvme0
    model: str
    size_bytes: int | None  # of its first namespace; None when it has none the kernel lists


@dataclass(frozen=True)
class Site:
    """What only the operator knows: where the host stands and what guards it."""

    region: str | None = None
    zone: str | None = None
    hardware_firewall: bool | None = None


@dataclass(frozen=True)
class Hardware:
    gpus: tuple[Gpu, ...] | None = None  # None: NVML not readable here
    cuda: str | None = None  # the CUDA version the driver supports, "12.4"
    numa: tuple[NumaNode, ...] | None = None
    rdma: tuple[RdmaPort, ...] | None = None  # None: no /sys/class/infiniband
    nvme: tuple[Nvme, ...] | None = None  # None: no /sys/class/nvme
    security: tuple[str, ...] = ()  # present features: "tpm", "sev-snp", "sev-snp-guest", "tdx-guest"
    site: Site = field(default_factory=Site)
    sources: Mapping[str, str] = field(default_factory=dict)  # fact -> where it was read
    notes: tuple[str, ...] = ()  # why a fact is absent (NVML: no driver, …)

    def gpu(self, gpu_id: str) -> Gpu | None:
        for g in self.gpus or ():
            if g.id == gpu_id:
                return g
        return None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"security": list(self.security), "sources": dict(self.sources), "notes": list(self.notes)}
        if self.gpus is not None:
            out["gpus"] = [{"index": g.index, "name": g.name, "class": g.gpu_class, "memory_bytes": g.memory_bytes,
                            "pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node} for g in self.gpus]
        if self.cuda is not None:
            out["cuda"] = self.cuda
        if self.numa is not None:
            out["numa"] = [{"node": n.node, "cpus": n.cpus} for n in self.numa]
        if self.rdma is not None:
            out["rdma"] = [{"device": p.device, "port": p.port, "state": p.state, "rate": p.rate, "rate_gbps": p.rate_gbps,
                            "link_layer": p.link_layer} for p in self.rdma]
        if self.nvme is not None:
            out["nvme"] = [{"name": d.name, "model": d.model, "size_bytes": d.size_bytes} for d in self.nvme]
        site = {k: v for k, v in (("region", self.site.region), ("zone", self.site.zone),
                                  ("hardware_firewall", self.site.hardware_firewall)) if v is not None}
        if site:
            out["site"] = site
        return out

    @classmethod
    def from_json(cls, body: Any) -> "Hardware":
        """ValueError naming the problem for what is not a hardware record (bounded lists)."""
        if not isinstance(body, dict):
            raise ValueError("hardware: an object expected")

        def items(key: str) -> list[Any] | None:
            v = body.get(key)
            if v is None:
                return None
            if not isinstance(v, list) or len(v) > MAX_ITEMS:
                raise ValueError(f"hardware.{key}: a list of at most {MAX_ITEMS}")
            return v
        try:
            gpus = items("gpus")
            numa, rdma, nvme = items("numa"), items("rdma"), items("nvme")
            site = body.get("site") or {}
            if not isinstance(site, dict):
                raise ValueError("hardware.site: an object expected")
            fw = site.get("hardware_firewall")
            if fw is not None and not isinstance(fw, bool):
                raise ValueError("hardware.site.hardware_firewall: true or false")
            sources = body.get("sources") or {}
            if not isinstance(sources, dict) or len(sources) > 32:
                raise ValueError("hardware.sources: an object of at most 32 entries")
            return cls(
                gpus=None if gpus is None else tuple(
                    Gpu(int(g["index"]), str(g["name"])[:128], str(g["class"])[:64], int(g["memory_bytes"]), str(g["pci_bus_id"])[:32],
                        None if g.get("numa_node") is None else int(g["numa_node"])) for g in gpus),
                cuda=None if body.get("cuda") is None else str(body["cuda"])[:16],
                numa=None if numa is None else tuple(NumaNode(int(n["node"]), str(n["cpus"])[:4096]) for n in numa),
                rdma=None if rdma is None else tuple(
                    RdmaPort(str(p["device"])[:64], int(p["port"]), str(p["state"])[:32], str(p["rate"])[:64],
                             None if p.get("rate_gbps") is None else float(p["rate_gbps"]), str(p.get("link_layer", ""))[:32])
                    for p in rdma),
                nvme=None if nvme is None else tuple(
                    Nvme(str(d["name"])[:32], str(d["model"])[:128], None if d.get("size_bytes") is None else int(d["size_bytes"]))
                    for d in nvme),
                security=tuple(str(s)[:32] for s in list(body.get("security") or [])[:16]),
                site=Site(None if site.get("region") is None else str(site["region"])[:128],
                          None if site.get("zone") is None else str(site["zone"])[:128], fw),
                sources={str(k)[:32]: str(v)[:256] for k, v in sources.items()},
                notes=tuple(str(n)[:256] for n in list(body.get("notes") or [])[:16]))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"hardware: not a hardware record ({type(e).__name__}: {e})") from None


# ---------------------------------------------------------------------- reading the host

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _numa_of_pci(sys_root: str, bus: str) -> int | None:
    """NVML's bus id has an 8-digit domain; sysfs uses 4 ("00000000:3B:00.0" -> "0000:3b:00.0")."""
    dom, _, rest = bus.partition(":")
    text = _read(os.path.join(sys_root, "bus/pci/devices", f"{dom[-4:]}:{rest}".lower(), "numa_node"))
    try:
        n = int(text) if text is not None else -1
    except ValueError:
        return None
    return n if n >= 0 else None


def _nvml(sys_root: str) -> tuple[tuple[Gpu, ...] | None, str | None, list[str]]:
    """(GPUs, CUDA version, notes) from NVML; (None, None, why) where it cannot be read."""
    from policyc.placer.nvml import gpu_class

    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception as e:  # ImportError, the library not found, the driver not loaded
        return None, None, [f"no NVML here ({type(e).__name__}: {e}): no GPU facts"]
    notes: list[str] = []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else str(bus)
            gpus.append(Gpu(i, name, gpu_class(name), int(pynvml.nvmlDeviceGetMemoryInfo(h).total), bus, _numa_of_pci(sys_root, bus)))
        cuda: str | None = None
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())
            cuda = f"{v // 1000}.{v % 1000 // 10}"
        except Exception as e:  # an old driver, or one that does not say
            notes.append(f"NVML does not give the CUDA driver version ({type(e).__name__}: {e})")
        return tuple(gpus), cuda, notes
    except Exception as e:  # a GPU that fails mid-read: the GPU facts are not known, not partial
        return None, None, [f"NVML failed reading the GPUs ({type(e).__name__}: {e}): no GPU facts"]
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that half-started
            pass


def _numa(sys_root: str) -> tuple[NumaNode, ...] | None:
    base = os.path.join(sys_root, "devices/system/node")
    nodes = []
    for d in glob.glob(os.path.join(base, "node[0-9]*")):
        cpus = _read(os.path.join(d, "cpulist"))
        if cpus is not None:
            nodes.append(NumaNode(int(os.path.basename(d)[4:]), cpus))
    return tuple(sorted(nodes, key=lambda n: n.node)) if nodes else None


def _rdma(sys_root: str) -> tuple[RdmaPort, ...] | None:
    base = os.path.join(sys_root, "class/infiniband")
    if not os.path.isdir(base):
        return None
    out = []
    for d in sorted(glob.glob(os.path.join(base, "*/ports/*")))[:MAX_ITEMS]:
        dev, port = d.split(os.sep)[-3], os.path.basename(d)
        if not port.isdigit():
            continue
        state = (_read(os.path.join(d, "state")) or "").partition(":")[2].strip() or "UNKNOWN"
        rate = _read(os.path.join(d, "rate")) or ""
        m = re.match(r"\s*([0-9.]+)\s*Gb/sec", rate)
        out.append(RdmaPort(dev, int(port), state, rate, float(m.group(1)) if m else None, _read(os.path.join(d, "link_layer")) or ""))
    return tuple(out)


def _nvme(sys_root: str) -> tuple[Nvme, ...] | None:
    base = os.path.join(sys_root, "class/nvme")
    if not os.path.isdir(base):
        return None
    out = []
    for d in sorted(glob.glob(os.path.join(base, "nvme[0-9]*")))[:MAX_ITEMS]:
        name = os.path.basename(d)
        size: int | None = None
        for ns in sorted(glob.glob(os.path.join(d, f"{name}n[0-9]*"))):  # its namespaces: size in 512-byte sectors
            text = _read(os.path.join(ns, "size"))
            if text is not None and text.isdigit():
                size = (size or 0) + int(text) * 512
        out.append(Nvme(name, _read(os.path.join(d, "model")) or "", size))
    return tuple(out)


def _security(sys_root: str, dev_root: str, cpuinfo: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """The present confidential-computing features, each with what showed it."""
    found: dict[str, str] = {}
    tpm = sorted(glob.glob(os.path.join(dev_root, "tpmrm[0-9]*")) + glob.glob(os.path.join(dev_root, "tpm[0-9]*")))
    if tpm:
        found["tpm"] = tpm[0]
    snp = _read(os.path.join(sys_root, "module/kvm_amd/parameters/sev_snp"))
    if snp is not None and snp.upper() in ("Y", "1"):
        found["sev-snp"] = os.path.join(sys_root, "module/kvm_amd/parameters/sev_snp") + f" = {snp}"
    if os.path.exists(os.path.join(dev_root, "sev-guest")):
        found["sev-snp-guest"] = os.path.join(dev_root, "sev-guest")
    flags: set[str] = set()
    for line in (_read(cpuinfo) or "").splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    if os.path.exists(os.path.join(dev_root, "tdx_guest")):
        found["tdx-guest"] = os.path.join(dev_root, "tdx_guest")
    elif "tdx_guest" in flags:
        found["tdx-guest"] = f"{cpuinfo} flag tdx_guest"
    if "sev_snp" in flags and "sev-snp" not in found and "sev-snp-guest" not in found:
        found["sev-snp"] = f"{cpuinfo} flag sev_snp"
    return tuple(sorted(found)), {f"security.{k}": v for k, v in found.items()}


def discover_hardware(site: Site = Site(), *, sys_root: str = "/sys", dev_root: str = "/dev",
                      cpuinfo: str = "/proc/cpuinfo", nvml: bool = True) -> Hardware:
    """This host's hardware facts and the operator's site facts, each with its source."""
    sources: dict[str, str] = {}
    notes: list[str] = []
    gpus: tuple[Gpu, ...] | None = None
    cuda: str | None = None
    if nvml:
        gpus, cuda, notes = _nvml(sys_root)
        if gpus is not None:
            sources["gpus"] = ("NVML (pynvml): nvmlDeviceGetName, nvmlDeviceGetMemoryInfo, nvmlDeviceGetPciInfo; "
                               f"NUMA node from {sys_root}/bus/pci/devices/<bus>/numa_node")
        if cuda is not None:
            sources["cuda"] = "NVML (pynvml): nvmlSystemGetCudaDriverVersion"
    numa, rdma, nvme = _numa(sys_root), _rdma(sys_root), _nvme(sys_root)
    if numa is not None:
        sources["numa"] = f"{sys_root}/devices/system/node/node*/cpulist"
    if rdma is not None:
        sources["rdma"] = f"{sys_root}/class/infiniband/*/ports/*/{{state,rate,link_layer}}"
    if nvme is not None:
        sources["nvme"] = f"{sys_root}/class/nvme/*/model, */nvme*n*/size"
    security, shown = _security(sys_root, dev_root, cpuinfo)
    sources.update(shown)
    for k, v in (("region", site.region), ("zone", site.zone), ("hardware_firewall", site.hardware_firewall)):
        if v is not None:
            sources[f"site.{k}"] = "the operator: the agent's configuration ([agent] table or --" + k.replace("_", "-") + ")"
    # bounded as a reader bounds them (`from_json`), so what is published reads back equal
    return Hardware(gpus, cuda, numa, rdma, nvme, security, site, {k: v[:256] for k, v in sources.items()},
                    tuple(n[:256] for n in notes[:16]))
