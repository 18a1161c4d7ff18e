"""Where a model server runs on its host: the NUMA node and CPUs its placement plan names
(`PlacementPlan.numa_node` / `.cpus`, the GPU's own NUMA node as the topology has it),
applied to the process the agent starts.

Two mechanisms, both applied by a small exec wrapper in the server's own process before it
execs the server (so the server, every thread it starts and everything it forks are born
pinned; nothing of the server runs unpinned first):

- `sched_setaffinity` to the plan's CPUs, always;
- a cpuset cgroup of its own (`policyc-server-<agent pid>-<name>`), where the host has a writable
  cpuset hierarchy (cgroup v2 with the cpuset controller, else the v1 `cpuset` mount):
  `cpuset.cpus` the plan's CPUs and `cpuset.mems` its NUMA node, so its memory is
  allocated on the GPU's node too. Without one, the memory binding is said not to hold
  (`Pinning.memory`), never claimed.

A CPU the plan names that this host does not have (a plan computed on another topology) is
refused (`PinError`, naming the CPUs), not silently narrowed.

    pin = Pin.of_plan(plan)                  # or Pin.of_gpu(topology, host, gpu), Pin.of_node(1)
    pinning = prepare(pin, "onnx-0")         # the cgroup made, the CPUs checked
    subprocess.Popen(pinning.argv(server_argv))
    read_affinity(pid)                       # (cpus, mems) from /proc/PID/status
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from policyc.placer.plan import PlacementPlan
    from policyc.placer.topology import Topology

CGROUP_PREFIX = "policyc-server-"
# argv: CPUS CGROUP_PROCS_OR_EMPTY AGENT_PID SERVER_ARGV…; a cgroup it cannot join is said (the agent then
# reports the memory binding as not holding), never fatal; a server that cannot be exec'd is 127
_WRAPPER = """# policyc-pin-wrapper
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG: the server ends with the agent that started it
if os.getppid() != int(sys.argv[3]):  # the agent ended before this line: so does the server
    os._exit(0)
del sys.argv[3]
os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(",")])
if sys.argv[2]:
    try:
        with open(sys.argv[2], "w") as f:
            f.write(str(os.getpid()))
    except OSError as e:
        sys.stderr.write("policyc agent: could not join the cpuset cgroup " + sys.argv[2] + ": " + str(e) + chr(10))
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as e:
    sys.stderr.write("policyc agent: " + sys.argv[3] + ": " + str(e) + chr(10))
    os._exit(127)
"""


class PinError(ValueError):
    pass


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The kernel's list format (`0-3,8`) -> (0, 1, 2, 3, 8); ValueError naming the bad part."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        try:
            lo, hi = int(a), int(b or a)
        except ValueError:
            raise ValueError(f"CPU list `{text}`: `{part}` is not a number or range") from None
        if lo < 0 or hi < lo or hi - lo > 4096:
            raise ValueError(f"CPU list `{text}`: `{part}` is not a range")
        out.extend(range(lo, hi + 1))
    return tuple(sorted(set(out)))


def cpu_list(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> `0-2,5`, as /proc and cgroup files write it."""
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        elif out and "-" not in out[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


@dataclass(frozen=True)
class Pin:
    numa_node: int
    cpus: tuple[int, ...]

    @classmethod
    def of_plan(cls, plan: "PlacementPlan") -> "Pin":
        """What the placer's plan for the server's GPU names."""
        return cls(int(plan.numa_node), tuple(plan.cpus))

    @classmethod
    def of_gpu(cls, topology: "Topology", host: str, gpu: str) -> "Pin":
        """What every plan that places on `host/gpu` names: the GPU's NUMA node and its CPUs
        (as `placer/sites.site` works them out); PinError for a GPU the topology lacks."""
        g = topology.gpu_index.get((host, gpu))
        if g is None:
            raise PinError(f"GPU {host}/{gpu} is not in the topology")
        numa = topology.numa[topology.gpus[g].numa]
        return cls(numa.node, tuple(numa.cpus))

    @classmethod
    def of_node(cls, node: int, sys_root: str = "/sys") -> "Pin":
        """NUMA node `node` of this host with the CPUs the kernel lists for it."""
        path = Path(sys_root) / "devices/system/node" / f"node{node}" / "cpulist"
        try:
            return cls(node, parse_cpu_list(path.read_text()))
        except OSError:
            raise PinError(f"NUMA node {node}: this host has none ({path} is not there)") from None

    def describe(self) -> str:
        return f"NUMA node {self.numa_node}, CPUs {cpu_list(self.cpus)}"


@dataclass(frozen=True)
class Pinning:
    """A pin made ready for one server: `argv` wraps its command so it starts pinned."""

    pin: Pin
    cgroup: Path | None  # its cpuset cgroup, None where the host has no writable cpuset hierarchy
    memory: str  # how its memory is bound: "cpuset.mems N", or why it is not

    def argv(self, server: Sequence[str]) -> list[str]:
        """`server`'s command behind a small exec wrapper that pins itself (affinity, then
        its cgroup) and execs the server in the same process: no `preexec_fn` in an agent
        that has threads (a fork child running Python code may deadlock on a lock another
        thread held), and the pid the agent holds is the server's."""
        procs = str(self.cgroup / "cgroup.procs") if self.cgroup is not None else ""
        return [sys.executable, "-S", "-E", "-c", _WRAPPER, ",".join(map(str, self.pin.cpus)), procs, str(os.getpid()), *server]

    @staticmethod
    def pinned(pid: int) -> bool:
        """Whether process `pid` is past the wrapper (it exec'd the server: pinned by then). An
        empty command line is not: while the kernel is in the middle of an exec (the vfork
        parent already resumed) the new image has no arguments yet."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return bool(cmdline) and b"policyc-pin-wrapper" not in cmdline

    def in_cgroup(self, pid: int) -> bool:
        """Whether process `pid` is in this pinning's cgroup (what /proc/PID/cgroup says)."""
        if self.cgroup is None:
            return False
        rel = "/" + self.cgroup.name
        try:
            return any(line.split(":", 2)[2].rstrip().endswith(rel) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                       if line.count(":") >= 2 and ("cpuset" in line.split(":")[1].split(",") or line.startswith("0::")))
        except OSError:
            return False

    def release(self) -> None:
        """Remove its cgroup once its process is gone (a cgroup still in use stays)."""
        if self.cgroup is not None:
            try:
                self.cgroup.rmdir()
            except OSError:
                pass


def cpuset_root() -> tuple[Path, int] | None:
    """A writable cpuset hierarchy: (its root, cgroup version), or None."""
    v2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.controllers").exists() else Path("/sys/fs/cgroup")
    try:
        if "cpuset" in (v2 / "cgroup.controllers").read_text().split() and os.access(v2, os.W_OK):
            return v2, 2
    except OSError:
        pass
    v1 = Path("/sys/fs/cgroup/cpuset")
    if (v1 / "cpuset.cpus").exists() and os.access(v1, os.W_OK):
        return v1, 1
    return None


def _check(pin: Pin) -> None:
    if not pin.cpus:
        raise PinError(f"the plan names no CPUs for NUMA node {pin.numa_node}")
    have = os.sched_getaffinity(0)
    missing = sorted(set(pin.cpus) - have)
    if missing:
        raise PinError(f"the plan names CPUs {cpu_list(tuple(missing))} (of {pin.describe()}), which this host does not "
                       f"have or this agent may not use (it may use {cpu_list(tuple(have))}): refused, not narrowed")


def prepare(pin: Pin, name: str) -> Pinning:
    """Check `pin` against this host and make the server's cpuset cgroup where one can be made."""
    _check(pin)
    root = cpuset_root()
    if root is None:
        return Pinning(pin, None, "not bound: no writable cpuset cgroup on this host (CPUs by sched_setaffinity only)")
    base, version = root
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
    path = base / f"{CGROUP_PREFIX}{os.getpid()}-{safe}"  # one hierarchy for every agent on the machine
    try:
        if version == 2:
            sub = (base / "cgroup.subtree_control")
            if "cpuset" not in sub.read_text().split():
                sub.write_text("+cpuset")
        path.mkdir(exist_ok=True)
        (path / "cpuset.cpus").write_text(cpu_list(pin.cpus))
        (path / "cpuset.mems").write_text(str(pin.numa_node))
    except OSError as e:
        try:
            path.rmdir()
        except OSError:
            pass
        if e.errno == 22 and not (Path("/sys/devices/system/node") / f"node{pin.numa_node}").exists():
            raise PinError(f"the plan names NUMA node {pin.numa_node}, which this host does not have") from None
        return Pinning(pin, None, f"not bound: the cpuset cgroup {path} could not be set ({e.strerror or e}); "
                                  "CPUs by sched_setaffinity only")
    return Pinning(pin, path, f"cpuset.mems {pin.numa_node} (cgroup v{version} {path})")


def read_affinity(pid: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(CPUs, memory nodes) process `pid` may use, from /proc/PID/status (what the kernel enforces)."""
    cpus: tuple[int, ...] = ()
    mems: tuple[int, ...] = ()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus = parse_cpu_list(line.split(":", 1)[1])
        elif line.startswith("Mems_allowed_list:"):
            mems = parse_cpu_list(line.split(":", 1)[1])
    return cpus, mems


__all__ = ["Pin", "PinError", "Pinning", "cpu_list", "parse_cpu_list", "prepare", "read_affinity"]
