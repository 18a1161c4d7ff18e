"""Each model-server process that policyc starts gets a cgroup (v2) of its own.

Why: a cgroup's `cpu.stat` is the kernel's count of the CPU its processes used, so with one
process per cgroup the CPU a model server spent is measured by the kernel, not reported by
the server (`audit/cgroup_cpu.py` apportions it to calls). The process is moved by writing
its pid to the new cgroup's `cgroup.procs` (all its threads move with it; what it forks
later is born there). The cgroup is `policyc-modelserver-<pid>` under the cgroup2 mount
(`/sys/fs/cgroup/unified` on hybrid hosts); no controller is enabled, as `cpu.stat` is
always there. Without a writable cgroup2 (not root, no mount) the process stays where it
is, said once in the log, and calls get no cgroup figure.
"""

from __future__ import annotations

import logging
from pathlib import Path

from policyc.audit.cgroup_cpu import cgroup2_root

log = logging.getLogger("policyc.modelserver.cgroup")

PREFIX = "policyc-modelserver-"
_warned = False


def place(pid: int, root: Path | None = None) -> Path | None:
    """Move process `pid` into a new cgroup of its own; its path, or None (said in the log)."""
    global _warned
    root = root or cgroup2_root()
    if root is None:
        if not _warned:
            log.warning("no cgroup2 mount: model servers run without a cgroup of their own (no cgroup CPU figures)")
            _warned = True
        return None
    path = root / f"{PREFIX}{pid}"
    try:
        path.mkdir(exist_ok=True)
        (path / "cgroup.procs").write_text(f"{pid}\n")
    except OSError as e:
        if not _warned:
            log.warning("cannot give model server %d a cgroup under %s (%s): no cgroup CPU figures", pid, root,
                        e.strerror or e)
            _warned = True
        try:
            path.rmdir()
        except OSError:
            pass
        return None
    return path


def release(path: Path | None) -> None:
    """Remove a model server's cgroup once its process is gone (anything left in it is
    moved to the parent first, so the directory can go)."""
    if path is None:
        return
    try:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                (path.parent / "cgroup.procs").write_text(f"{pid}\n")
            except OSError:
                pass
        path.rmdir()
    except OSError:
        pass


def reap_stale(root: Path | None = None) -> int:
    """Remove the empty `policyc-modelserver-<pid>` cgroups of processes that are gone (a
    killed run's leftovers; a live pid's cgroup is being filled, so it stays); how many went."""
    root = root or cgroup2_root()
    gone = 0
    if root is None:
        return 0
    for d in root.glob(f"{PREFIX}*"):
        pid = d.name[len(PREFIX):]
        try:
            if pid.isdigit() and not Path(f"/proc/{pid}").exists() and not (d / "cgroup.procs").read_text().split():
                d.rmdir()
                gone += 1
        except OSError:
            continue
    return gone
