"""The kernel plane on the real data path: its TC programs on the interfaces the gateway's
traffic crosses, its connect hooks on a cgroup of the gateway's own (Envoy runs in it), and
its backend map in step with the registered pool.

Why a cgroup of its own: the connect hooks redirect every `connect()` made from their
cgroup, so they must see Envoy's upstream connections and nothing else of the host. With
no cgroup configured, one is made under the cgroup2 mount (`policyc-gateway-<pid>-<n>`) and
removed at `detach()`; a configured one is used as it is and left in place.

Backends: every pool endpoint is registered with the guardian, its quarantine target being
an endpoint of the backup model its redirect breaker names (the same choice the picker
makes for a retry). A quarantine then makes the gateway's *new* upstream connections to
that model server land on the backup, in the kernel, until it expires.

`detach()` leaves nothing behind: our TC filters (by their priority and this plane's
handle) are deleted, the connect hooks detached, a cgroup we made removed (its processes
moved back to the parent). What a process killed before it could detach left is removed by
the next `attach()` (see `_reap_stale_cgroups`, `KernelPlane._reap_stale_filters`).

`policyc serve` owns one (server/kernel_path.py) and `policyc gateway` puts its Envoy on it;
a gateway next to a decision service that attached none attaches its own.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Protocol

from policyc.enforcer.endpoint import Endpoint, EndpointError

if TYPE_CHECKING:  # the configuration is read by `ServeConfig` without the enforcer's weight
    from policyc.enforcer.guardian import Guardian

log = logging.getLogger("policyc.enforcer")


class DataPathError(RuntimeError):
    """The kernel plane could not be put on the data path; says where and why."""


class Attachable(Protocol):
    """The part of `KernelPlane` the data path uses."""

    def attach_tc(self, ifname: str = "lo", netns: str | None = None) -> None: ...
    def detach_tc(self, ifname: str = "lo", netns: str | None = None) -> None: ...
    def attach_cgroup(self, cgroup: Path) -> None: ...
    def detach_cgroup(self, cgroup: Path) -> None: ...
    @property
    def cgroup2_root(self) -> Path | None: ...


_cgroups = itertools.count(1)  # one process may hold several data paths (tests): each its own cgroup


@dataclass(frozen=True, slots=True)
class DataPathConfig:
    interfaces: tuple[str, ...] = ("lo",)  # the demo's data plane is on loopback
    cgroup: Path | None = None  # None: a cgroup of our own under the cgroup2 mount


def is_attachable(plane: object) -> bool:
    return all(hasattr(plane, n) for n in ("attach_tc", "attach_cgroup", "detach_tc", "detach_cgroup"))


class DataPath:
    def __init__(self, guardian: "Guardian", config: DataPathConfig = DataPathConfig()) -> None:
        plane = guardian.plane
        if not is_attachable(plane):
            raise DataPathError("the kernel plane is not loaded (start with --enforcer kernel)")
        self.guardian = guardian
        self.plane: Attachable = plane  # type: ignore[assignment]
        self.config = config
        self.cgroup: Path | None = None
        self._made_cgroup = False
        self._tc: list[str] = []
        self._backends: dict[Endpoint, Endpoint] = {}

    def attach(self) -> "DataPath":
        if self.plane.cgroup2_root is not None:
            self._reap_stale_cgroups(Path(self.plane.cgroup2_root))
        try:
            for ifname in self.config.interfaces:
                self.plane.attach_tc(ifname)
                self._tc.append(ifname)
            self.cgroup = self.config.cgroup or self._make_cgroup()
            self.plane.attach_cgroup(self.cgroup)
        except Exception as e:
            self.detach()
            raise DataPathError(f"attaching the kernel plane to the data path: {e}") from e
        return self

    def _make_cgroup(self) -> Path:
        root = self.plane.cgroup2_root
        if root is None:
            raise DataPathError("no cgroup2 mount found (findmnt -t cgroup2) for the gateway's connect hooks")
        path = Path(root) / f"policyc-gateway-{os.getpid()}-{next(_cgroups)}"
        try:
            path.mkdir()
        except OSError as e:
            raise DataPathError(f"making the gateway's cgroup {path}: {e.strerror}") from e
        self._made_cgroup = True
        return path

    def adopt(self, pid: int) -> None:
        """Move the gateway's process (Envoy) into the hooked cgroup."""
        if self.cgroup is None:
            raise DataPathError("the data path is not attached")
        try:
            (self.cgroup / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as e:
            raise DataPathError(f"moving pid {pid} into {self.cgroup}: {e.strerror}") from e

    def sync(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        """`pairs`: (endpoint, its backup's endpoint or None) for every pool member."""
        want: dict[Endpoint, Endpoint] = {}
        for ep, backup in pairs:
            if backup is None:
                continue
            try:
                want[Endpoint.parse(ep)] = Endpoint.parse(backup)
            except EndpointError as e:
                log.warning("data path: pool endpoint %s not usable: %s", ep, e)
        for backend, target in want.items():
            if self._backends.get(backend) != target:
                self.guardian.register_backend(backend, target)
        for gone in set(self._backends) - set(want):
            self.guardian.unregister_backend(gone)
        self._backends = want

    def backends(self) -> dict[Endpoint, Endpoint]:
        return dict(self._backends)

    def detach(self) -> None:
        """Undo `attach`: nothing of ours stays on the interfaces or the cgroup."""
        if self.cgroup is not None:
            try:
                self.plane.detach_cgroup(self.cgroup)
            except Exception as e:  # noqa: BLE001 - keep detaching the rest
                log.error("data path: detaching the connect hooks from %s: %s", self.cgroup, e)
            if self._made_cgroup:
                self._remove_cgroup(self.cgroup)
            self.cgroup = None
        for ifname in self._tc:
            try:
                self.plane.detach_tc(ifname)
            except Exception as e:  # noqa: BLE001
                log.error("data path: detaching TC from %s: %s", ifname, e)
        self._tc = []

    @staticmethod
    def _reap_stale_cgroups(root: Path) -> None:
        """Remove gateway cgroups left by a policyc process that died without detaching
        (SIGKILL), once nothing runs in them (removing one drops its connect hooks too). A
        live process's, or one with a process still inside, is left alone."""
        from policyc.enforcer.kernel_plane import pid_gone

        for path in root.glob("policyc-gateway-*"):
            pid = path.name.removeprefix("policyc-gateway-").partition("-")[0]
            if not pid.isdigit() or int(pid) == os.getpid() or not pid_gone(int(pid)):
                continue
            try:
                path.rmdir()
                log.warning("data path: removed cgroup %s left by policyc process %s, which is gone", path, pid)
            except OSError as e:  # a process still in it (its Envoy outlived it), or reaped by another
                log.debug("data path: stale cgroup %s stays: %s", path, e.strerror)

    @staticmethod
    def _remove_cgroup(path: Path) -> None:
        try:
            left = [p for p in (path / "cgroup.procs").read_text().split() if p]
            for pid in left:  # a process still inside (Envoy not yet reaped): back to the parent
                try:
                    (path.parent / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            path.rmdir()
        except OSError as e:
            log.error("data path: removing cgroup %s: %s", path, e.strerror)
