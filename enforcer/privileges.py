"""Can this process run the kernel plane? Asked up front because bcc's own errors mislead.

Without CAP_SYS_ADMIN/CAP_BPF, bcc reports "could not open bpf map ... Operation not
permitted" or "Failed to compile BPF module", which reads like a bug in the program.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_BPF = 39


@dataclass(frozen=True, slots=True)
class KernelSupport:
    available: bool
    reason: str  # why not, in plain words; "" when available
    cgroup2: Path | None


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def cgroup2_mount() -> Path | None:
    """Where cgroup v2 is mounted (on some hosts /sys/fs/cgroup/unified, not /sys/fs/cgroup)."""
    if shutil.which("findmnt"):
        out = subprocess.run(["findmnt", "-rn", "-t", "cgroup2", "-o", "TARGET"], capture_output=True, text=True)
        lines = out.stdout.split()
        if lines:
            return Path(lines[0])
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def kernel_support() -> KernelSupport:
    caps = _effective_caps()
    has_bpf = bool(caps & (1 << CAP_SYS_ADMIN)) or bool(caps & (1 << CAP_BPF))
    if os.geteuid() != 0 and not has_bpf:
        return KernelSupport(False, "not root and no CAP_BPF/CAP_SYS_ADMIN: the kernel plane needs them to load BPF programs", None)
    if not caps & (1 << CAP_NET_ADMIN):
        return KernelSupport(False, "no CAP_NET_ADMIN: TC programs cannot be attached", None)
    if not Path("/sys/fs/bpf").exists() and not Path("/proc/sys/kernel/unprivileged_bpf_disabled").exists():
        return KernelSupport(False, "this kernel exposes no BPF support", None)
    try:
        import bcc  # noqa: F401
    except ImportError:
        return KernelSupport(False, "bcc is not importable (install python3-bpfcc; see scripts/setup.sh)", None)
    return KernelSupport(True, "", cgroup2_mount())
