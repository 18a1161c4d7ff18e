"""The hardware and site facts a host agent discovers (`cluster/host_hardware.py`), each
with its source, and the rule that judges an instance's claims by them
(`cluster/host_claims.py`):

- this machine's own /sys, /dev and /proc/cpuinfo: the NUMA nodes and their CPU lists,
  the NVMe controllers and RDMA ports where the kernel lists them (absent where it does
  not: never an invented default), TPM / SEV-SNP / TDX presence as the paths show it;
- GPUs (class, memory, PCI bus, the GPU's NUMA node) and the CUDA driver version from NVML,
  through the project's stand-in driver loaded by pynvml unchanged;
- RDMA ports, NVMe sizes and confidential-computing markers from a tree laid out as the
  kernel lays them out (this machine has none of them);
- a claim its host's agent contradicts is refused naming the field, both values and the
  source; the facts a supervised server's instance leaves out are filled from the host."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import pytest

from policyc.cluster.host_claims import claims_problem, fill
from policyc.cluster.host_facts import HostFacts, discover
from policyc.cluster.host_hardware import Hardware, Site, discover_hardware
from policyc.matcher import Instance
from policyc.placer.localhost import parse_cpulist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "placer"))
import nvml_stand_in as stand_in  # noqa: E402
from nvml_stand_in import Gpu, write_table  # noqa: E402


def test_this_machines_sys_as_the_agent_reads_it() -> None:
    hw = discover_hardware(Site(region="us-west", zone="us-west-2a", hardware_firewall=True), nvml=False)
    nodes = sorted(int(Path(d).name[4:]) for d in glob.glob("/sys/devices/system/node/node[0-9]*"))
    if nodes:
        assert hw.numa is not None and [n.node for n in hw.numa] == nodes
        for n in hw.numa:  # the kernel's own cpulist, and together every online CPU
            assert n.cpus == Path(f"/sys/devices/system/node/node{n.node}/cpulist").read_text().strip()
        assert set(os.sched_getaffinity(0)) <= {c for n in hw.numa for c in parse_cpulist(n.cpus)}
        assert hw.sources["numa"].startswith("/sys/devices/system/node")
    else:
        assert hw.numa is None and "numa" not in hw.sources
    for kind, base in (("nvme", "/sys/class/nvme"), ("rdma", "/sys/class/infiniband")):
        got = getattr(hw, kind)
        if not os.path.isdir(base):  # absent where the kernel lists none: not an empty default, not zero
            assert got is None and kind not in hw.sources
        elif kind == "nvme":
            assert [d.name for d in got] == sorted(p.name for p in Path(base).glob("nvme[0-9]*"))
        else:
            assert {(p.device, str(p.port)) for p in got} == {(Path(d).parts[-3], Path(d).name) for d in glob.glob(f"{base}/*/ports/*")}
    assert ("tpm" in hw.security) == bool(glob.glob("/dev/tpm[0-9]*") + glob.glob("/dev/tpmrm[0-9]*"))
    assert ("tdx-guest" in hw.security) == (os.path.exists("/dev/tdx_guest") or " tdx_guest" in Path("/proc/cpuinfo").read_text())
    assert all(f"security.{f}" in hw.sources for f in hw.security)
    assert hw.gpus is None and hw.cuda is None  # not read: absent, not "no GPU"
    assert hw.site == Site("us-west", "us-west-2a", True)
    assert hw.sources["site.region"].startswith("the operator") and "zone" in hw.sources["site.zone"]
    # what the agent publishes survives the store as it was
    facts = discover("host-0003", hw.site, hardware=True)
    assert HostFacts.from_json(facts.to_json()) == facts


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")


def test_rdma_nvme_and_confidential_computing_read_from_a_kernel_shaped_tree(tmp_path: Path) -> None:
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    _tree(sysfs, {
        "class/infiniband/mlx5_0/ports/1/state": "4: ACTIVE", "class/infiniband/mlx5_0/ports/1/rate": "200 Gb/sec (4X HDR)",
        "class/infiniband/mlx5_0/ports/1/link_layer": "InfiniBand",
        "class/infiniband/mlx5_1/ports/1/state": "1: DOWN", "class/infiniband/mlx5_1/ports/1/rate": "10 Gb/sec (4X SDR)",
        "class/infiniband/mlx5_1/ports/1/link_layer": "Ethernet",
        "class/nvme/nvme0/model": "SAMSUNG MZQL23T8HCLS-00A07", "class/nvme/nvme0/nvme0n1/size": "7501476528",
        "class/nvme/nvme1/model": "INTEL SSDPF2KX038T1",  # no namespace: size unknown, not zero
        "devices/system/node/node0/cpulist": "0-15,32-47", "devices/system/node/node1/cpulist": "16-31,48-63",
        "module/kvm_amd/parameters/sev_snp": "Y"})
    _tree(dev, {"tpmrm0": "", "tdx_guest": ""})
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu vme sev sev_es sev_snp\n")
    hw = discover_hardware(sys_root=str(sysfs), dev_root=str(dev), cpuinfo=str(cpuinfo), nvml=False)
    assert hw.rdma is not None and [(p.device, p.port, p.state, p.rate_gbps, p.link_layer) for p in hw.rdma] == [
        ("mlx5_0", 1, "ACTIVE", 200.0, "InfiniBand"), ("mlx5_1", 1, "DOWN", 10.0, "Ethernet")]
    assert hw.nvme is not None and [(d.name, d.model, d.size_bytes) for d in hw.nvme] == [
        ("nvme0", "SAMSUNG MZQL23T8HCLS-00A07", 7501476528 * 512), ("nvme1", "INTEL SSDPF2KX038T1", None)]
    assert hw.numa is not None and [(n.node, n.cpus) for n in hw.numa] == [(0, "0-15,32-47"), (1, "16-31,48-63")]
    assert hw.security == ("sev-snp", "tdx-guest", "tpm")
    assert hw.sources["security.tpm"].endswith("tpmrm0") and "sev_snp = Y" in hw.sources["security.sev-snp"]
    assert "infiniband" in hw.sources["rdma"] and "nvme" in hw.sources["nvme"]
    assert hw.site == Site() and not any(k.startswith("site.") for k in hw.sources)  # the operator said nothing
    assert Hardware.from_json(hw.to_json()) == hw
    with pytest.raises(ValueError, match="hardware.gpus: a list of at most"):
        Hardware.from_json({"gpus": [{}] * 1000})
    with pytest.raises(ValueError, match="not a hardware record"):
        Hardware.from_json({"gpus": [{"index": 0}]})


CHILD = r"""
import json, sys
from policyc.cluster.host_hardware import discover_hardware, Site
from policyc.placer import LocalHostSource, NvmlSource
hw = discover_hardware(Site(region="eu-west"), sys_root=sys.argv[1])
local = LocalHostSource(sys.argv[1], nvml=NvmlSource()).topology()  # the embedded default's topology of this host
print(json.dumps({**hw.to_json(), "local": {"cuda": local.hosts[0].cuda, "gpus": [g.model for g in local.gpus]}}))
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in.built(tmp_path_factory)


def test_gpus_and_cuda_from_nvml_through_the_stand_in(driver: Path, tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    _tree(sysfs, {"bus/pci/devices/0000:3b:00.0/numa_node": "1", "bus/pci/devices/0000:86:00.0/numa_node": "-1",
                  "devices/system/node/node0/cpulist": "0-7", "devices/system/node/node1/cpulist": "8-15"})
    table = tmp_path / "gpus.table"
    write_table(table, [Gpu(), Gpu(name="NVIDIA A100-SXM4-80GB", bus_id="00000000:86:00.0", mem_total=81920 * 2**20)], cuda=12080)
    got = stand_in.run_python(driver, table, CHILD, str(sysfs))
    hw = Hardware.from_json({k: v for k, v in got.items() if k != "local"})
    # the embedded default's own topology of this host agrees with its agent (no claim could satisfy both otherwise)
    assert got["local"] == {"cuda": "12.8", "gpus": ["H100", "A100-80G"]}
    assert hw.gpus is not None and [(g.id, g.gpu_class, g.memory_bytes, g.pci_bus_id, g.numa_node) for g in hw.gpus] == [
        ("gpu0", "H100", 80 * 2**30, "00000000:3B:00.0", 1), ("gpu1", "A100-80G", 81920 * 2**20, "00000000:86:00.0", None)]
    assert hw.cuda == "12.8" and "nvmlSystemGetCudaDriverVersion" in hw.sources["cuda"] and "NVML" in hw.sources["gpus"]
    # a driver that does not give its CUDA version: the GPUs, no CUDA fact, and a note why
    write_table(table, [Gpu()])
    hw = Hardware.from_json({k: v for k, v in stand_in.run_python(driver, table, CHILD, str(sysfs)).items() if k != "local"})
    assert hw.gpus is not None and len(hw.gpus) == 1 and hw.cuda is None and "cuda" not in hw.sources
    assert any("CUDA driver version" in n for n in hw.notes)
    # NVML that fails to start: no GPU facts at all (not "no GPU")
    write_table(table, [Gpu()], init_error=9)
    hw = Hardware.from_json({k: v for k, v in stand_in.run_python(driver, table, CHILD, str(sysfs)).items() if k != "local"})
    assert hw.gpus is None and hw.cuda is None and any("no NVML here" in n for n in hw.notes)


def _facts(**site: object) -> HostFacts:
    hw = Hardware(gpus=(stand_in_gpu(0, "H100", 1), stand_in_gpu(1, "A100-80G", None)), cuda="12.8",
                  site=Site(**site),  # type: ignore[arg-type]
                  sources={"gpus": "NVML (pynvml)", "cuda": "NVML (pynvml): nvmlSystemGetCudaDriverVersion",
                           "site.region": "the operator: the agent's configuration"})
    return HostFacts("host-0003", (), hardware=hw)


def stand_in_gpu(i: int, cls: str, numa: int | None):  # type: ignore[no-untyped-def]
    from policyc.cluster.host_hardware import Gpu as HwGpu

    return HwGpu(i, f"NVIDIA {cls}", cls, 80 * 2**30, f"00000000:{i:02x}:00.0", numa)


def _instance(**deployment: object) -> Instance:
    d = {"host": "host-0003", "gpu": "gpu0", "gpu_model": "H100", "region": "eu-west", "numa_node": 1, "cuda": "12.8",
         **deployment}
    return Instance.model_validate({"id": "recommender@host-0003/gpu0", "model": "recommender", "deployment": d})


def test_a_claim_its_hosts_agent_contradicts_is_refused_naming_both_values_and_the_source() -> None:
    facts = _facts(region="eu-west", hardware_firewall=False)
    assert claims_problem(_instance(), facts) is None
    for claim, field, words in (({"gpu_model": "A100-80G"}, "deployment.gpu_model", "host-0003/gpu0 as `H100` (NVML"),
                                ({"numa_node": 0}, "deployment.numa_node", "as `1`"),
                                ({"cuda": "12.4"}, "deployment.cuda", "as `12.8` (NVML (pynvml): nvmlSystemGetCudaDriverVersion)"),
                                ({"region": "us-west"}, "deployment.region", "as `eu-west` (the operator"),
                                ({"hardware_firewall": True}, "deployment.hardware_firewall", "as `false`"),
                                ({"gpu": "gpu7"}, "deployment.gpu", "reports gpu0, gpu1")):
        e = claims_problem(_instance(**claim), facts)
        assert e is not None and e.field == field and e.diagnostics[0].code == "E733" and words in e.message, (claim, e and e.message)
        assert e.status.name == "FAILED_PRECONDITION"
    # what the host does not report is not judged here: gpu1's NUMA node, a region not configured
    assert claims_problem(_instance(gpu="gpu1", gpu_model="A100-80G", numa_node=0), _facts()) is None
    assert claims_problem(_instance(region="anywhere"), _facts()) is None
    assert claims_problem(_instance(region="anywhere"), HostFacts("host-0003", ())) is None  # an agent of interfaces only


def test_the_facts_a_servers_instance_leaves_out_are_its_hosts() -> None:
    facts = _facts(region="eu-west", hardware_firewall=True)
    got = fill({"host": "host-0003", "gpu": "gpu0", "endpoint": "192.0.2.2:8000"}, facts, "server 1: instance")
    assert got == {"host": "host-0003", "gpu": "gpu0", "endpoint": "192.0.2.2:8000", "gpu_model": "H100", "numa_node": 1,
                   "cuda": "12.8", "region": "eu-west", "hardware_firewall": True}
    with pytest.raises(ValueError, match=r"server 1: instance: `deployment.gpu_model` is `L4` but this host's is `H100`"):
        fill({"host": "host-0003", "gpu": "gpu0", "gpu_model": "L4"}, facts, "server 1: instance")
    with pytest.raises(ValueError, match="`deployment.gpu` `gpu5`: this host has gpu0, gpu1"):
        fill({"host": "host-0003", "gpu": "gpu5"}, facts, "server 1: instance")
