"""`policyc agent run --servers FILE`: the model servers the agent starts and supervises, as
JSON — a list of objects, each with its placement as the plan names it:

    [{"name": "onnx-0", "argv": ["policyc", "modelserver", "--model", "m.onnx", "--http-port", "8081"],
      "numa_node": 1, "cpus": "16-31", "env": {"OMP_NUM_THREADS": "16"},
      "instance": {"id": "fraud-scorer@host-3/gpu1", "model": "fraud-scorer",
                   "deployment": {"host": "host-3", "gpu": "gpu1", "endpoint": "10.0.0.3:8081", …}}}]

Instead of `numa_node`, `"gpu": "gpu1"` pins the server where every plan placing on that GPU
says (its NUMA node and CPUs, from this host's topology: NVML and /sys, as the decision
service's local telemetry reads it). `cpus` may be left out: the NUMA node's own CPUs, as this host's kernel lists them
(`/sys/devices/system/node/nodeN/cpulist`). `instance`, where given, is registered by the
agent while the server runs (its host must be the agent's, its endpoint on the host's own
addresses: the fleet refuses it otherwise). A bad entry is a ValueError naming the file,
the entry and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from typing import TYPE_CHECKING

from pydantic import ValidationError

from policyc.matcher import Instance

from .server_pinning import Pin, PinError, parse_cpu_list
from .server_supervisor import ServerSpec

if TYPE_CHECKING:
    from policyc.placer.topology import Topology

    from .host_facts import HostFacts

MAX_SERVERS = 256
MAX_BYTES = 1 << 20


def load_specs(path: Path, sys_root: str = "/sys", facts: "HostFacts | None" = None) -> list[ServerSpec]:
    """The servers of `path`; with this host's `facts`, an instance's deployment may leave
    out what the host knows (GPU class, the GPU's NUMA node, CUDA, region, hardware
    firewall: filled from it, `host_claims.fill`), and one that contradicts it is refused."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{path}: {len(raw)} bytes (at most {MAX_BYTES})")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(body, list) or len(body) > MAX_SERVERS:
        raise ValueError(f"{path}: a list of at most {MAX_SERVERS} model servers expected")
    out = []
    topology: Topology | None = None
    for i, item in enumerate(body):
        where = f"{path}: server {i + 1}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: an object expected")
        unknown = set(item) - {"name", "argv", "numa_node", "cpus", "env", "instance", "gpu"}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        argv, env, node = item.get("argv"), item.get("env") or {}, item.get("numa_node")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"{where}: `argv` must be a non-empty list of strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError(f"{where}: `env` must map strings to strings")
        gpu = item.get("gpu")
        if gpu is not None and (node is not None or item.get("cpus") is not None or not isinstance(gpu, str)):
            raise ValueError(f"{where}: `gpu` (a GPU of this host: its NUMA node and CPUs) or `numa_node`/`cpus`, not both")
        if gpu is None and (isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < 1024):
            raise ValueError(f"{where}: `numa_node` must be the plan's NUMA node (an integer), or give `gpu`")
        try:
            cpus = item.get("cpus")
            if gpu is not None:
                topology = topology or _host_topology(sys_root)
                pin = Pin.of_gpu(topology, topology.hosts[0].name, gpu)
            else:
                assert isinstance(node, int)  # checked above when no `gpu` is given
                n = node
                pin = Pin(n, parse_cpu_list(str(cpus))) if cpus is not None else Pin.of_node(n, sys_root)
            raw_inst = item.get("instance")
            if facts is not None and isinstance(raw_inst, dict) and isinstance(raw_inst.get("deployment"), dict):
                from .host_claims import fill

                raw_inst = {**raw_inst, "deployment": fill(raw_inst["deployment"], facts, "instance")}
            inst = Instance.model_validate(raw_inst) if raw_inst is not None else None
            out.append(ServerSpec(str(item.get("name") or ""), tuple(argv), pin, dict(env), inst))
        except ValidationError as e:
            first = e.errors()[0]
            raise ValueError(f"{where}: instance.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        except (PinError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    return out


def _host_topology(sys_root: str) -> "Topology":
    """This host as the decision service's local telemetry sees it (NUMA from /sys, GPUs
    from NVML with their PCI NUMA node): the topology a plan for this host is made on."""
    from policyc.placer import LocalHostSource, NvmlSource

    return LocalHostSource(sys_root, nvml=NvmlSource()).topology()


__all__ = ["load_specs"]
