"""The kernel plane: one bcc module with every program and map, loaded once per process.

It attaches TC observers to interfaces (optionally inside a named network namespace) and
cgroup connect hooks to a cgroup, keeps the quarantine / backend / rule maps, and turns
ring-buffer events into audit records and stream timings. Map changes go through the `ctl`
program so that each is audited by the kernel itself; programs are never reloaded when a
new bundle arrives, only map contents change.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes as ct
import fcntl
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.kernel_abi import CBackendKey, CCtlCmd, CEndpoint, CFlowKey, ConfigSlot, EventKind, MapOp
from policyc.enforcer.kernel_events import KernelEvent
from policyc.enforcer.privileges import kernel_support
from policyc.enforcer.records import ActionRecord
from policyc.enforcer.rule_table import KernelRules
from policyc.enforcer.sock_destroy import end_tcp_by_cookie, end_tcp_to_many

log = logging.getLogger("policyc.enforcer")

SOURCE = Path(__file__).with_name("kernel") / "enforcer.bpf.c"
_TC_INGRESS_PARENT = "ffff:fff2"
_TC_EGRESS_PARENT = "ffff:fff3"
_TC_PRIO = 0xC0DE & 0x7FFF  # our filters' priority ...
_planes = itertools.count(1)  # ... and each plane's own handle under it, so detach removes only its own


def _tc_handle() -> int:
    """A filter handle unique to this plane among processes: the pid, and a count within it."""
    return ((os.getpid() & 0xFFFFFF) << 8 | next(_planes) & 0xFF) or 1


TC_LOCK = Path("/run/lock/policyc-tc.lock")
COLLECT_MS = 5  # how often stream ends (written without a wakeup) are collected


@contextlib.contextmanager
def _tc_lock() -> Iterator[None]:
    """Every policyc process on the host changes TC under one lock: removing a clsact qdisc
    we added once no filter is left under it must not race another process adding its own
    filters under it (deleting the qdisc would take them along, unseen)."""
    path = TC_LOCK if TC_LOCK.parent.is_dir() else Path("/tmp") / TC_LOCK.name
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _clsact_mark(netns: str | None, ifname: str, ifindex: int) -> Path:
    """Where a policyc process notes that policyc added an interface's clsact qdisc, so that
    whichever policyc process removes the last filter under it removes the qdisc too (not
    only the one that added it, which may have detached, or died, before the others)."""
    return (TC_LOCK.parent if TC_LOCK.parent.is_dir() else Path("/tmp")) / "policyc-clsact" / f"{netns or '-'}.{ifname}.{ifindex}"


def pid_gone(pid: int) -> bool:
    """No process `pid` any more (a plane's filters, a gateway cgroup, left by one that died)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# Stream observations (over budget, a frame walk that lost its place) are audited only for
# streams to or from a registered backend: TC on an interface sees every HTTP/2 stream on
# it (on lo: etcd watches, health checks, the clients' side of the gateway), and those are
# not the model servers' to answer for. Listeners still receive every event.
_OF_A_STREAM = frozenset({EventKind.STREAM_DONE, EventKind.H2_DESYNC})


class KernelPlaneError(RuntimeError):
    """The kernel plane could not load or attach; the message says why in plain words."""


@dataclass(frozen=True, slots=True)
class FlowCounters:
    packets: int
    bytes: int
    payload: int


@dataclass(frozen=True, slots=True)
class _TcAttachment:
    ifname: str
    ifindex: int
    netns: str | None


class KernelPlane:
    """Real BPF enforcement. Construct once per process (compile costs ~1 s and ~150 MB)."""

    kernel_enforcement = True

    def __init__(self, audit: Callable[[ActionRecord], None] | None = None) -> None:
        support = kernel_support()
        if not support.available:
            raise KernelPlaneError(f"kernel enforcement unavailable: {support.reason}")
        from bcc import BPF  # imported here: bcc exists only where python3-bpfcc is installed

        try:
            self._bpf = BPF(src_file=str(SOURCE).encode())
            self._fn_ingress = self._bpf.load_func(b"tc_ingress", BPF.SCHED_CLS)
            self._fn_egress = self._bpf.load_func(b"tc_egress", BPF.SCHED_CLS)
            self._fn_ctl = self._bpf.load_func(b"ctl", BPF.SCHED_CLS)
            from bcc import BPFAttachType

            self._fn_c4 = self._bpf.load_func(b"on_connect4", BPF.CGROUP_SOCK_ADDR, attach_type=BPFAttachType.CGROUP_INET4_CONNECT)
            self._fn_c6 = self._bpf.load_func(b"on_connect6", BPF.CGROUP_SOCK_ADDR, attach_type=BPFAttachType.CGROUP_INET6_CONNECT)
        except Exception as exc:  # bcc raises bare Exception on compile/load failure
            raise KernelPlaneError(f"loading {SOURCE.name} failed: {exc}") from exc
        self._cgroup2 = support.cgroup2
        self._audit = audit
        self._listeners: list[Callable[[KernelEvent], None]] = []
        self._rule_names: dict[int, str] = {}
        self._backend_eps: set[Endpoint] = set()  # registered backends: the streams worth an audit record
        self._tc: list[_TcAttachment] = []
        self._tc_handle = _tc_handle()
        self._cgroups: list[tuple[int, Path]] = []
        self._lock = threading.Lock()
        self._bpf[b"events"].open_ring_buffer(self._on_raw_event)
        self._stop = threading.Event()
        self._reading = threading.Lock()  # libbpf's ring buffer has one reader at a time
        self._poller = threading.Thread(target=self._poll, name="policyc-ringbuf", daemon=True)
        self._poller.start()
        # bcc frees the ring buffer in an exit handler of its own while daemon threads still
        # run: ours, registered later, runs first and stops the reader before that
        atexit.register(self._halt_poller)
        self._installed_rules: set[int] = set()

    # ----------------------------------------------------------------- events

    def subscribe(self, listener: Callable[[KernelEvent], None]) -> Callable[[], None]:
        """Receive every ring-buffer event; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def set_audit(self, audit: Callable[[ActionRecord], None] | None) -> None:
        self._audit = audit

    def _on_raw_event(self, _ctx: object, data: int, size: int) -> None:
        ev = KernelEvent.decode(ct.string_at(data, size))
        if self._audit is not None and (ev.kind not in _OF_A_STREAM or ev.a in self._backend_eps or ev.b in self._backend_eps):
            record = ev.to_record(self._rule_names)
            if record is not None:
                self._audit(record)
        for listener in list(self._listeners):
            listener(ev)

    def _poll(self) -> None:
        """Rare events (a redirect, a drop, a map change) wake the poll at once; stream ends
        are written without a wakeup (`emit_quiet` in the C source) and collected here every
        `COLLECT_MS`, in one batch per interval instead of one thread switch per stream."""
        while not self._stop.is_set():
            with self._reading:
                self._bpf.ring_buffer_poll(COLLECT_MS)
                self._bpf.ring_buffer_consume()

    def drain(self) -> None:
        """Deliver every event already in the ring buffer before returning (waits for the
        poller's current interval: one reader at a time)."""
        with self._reading:
            self._bpf.ring_buffer_consume()

    # ----------------------------------------------------------------- attach

    def attach_tc(self, ifname: str = "lo", netns: str | None = None) -> None:
        """Observe an interface at ingress and egress (clsact, direct action).

        Our filters carry our priority and a handle of this plane's own, so that several
        planes (processes) can observe one interface and each detaches only its filters;
        a clsact qdisc policyc had to add is noted (`_clsact_mark`) and removed with the last
        policyc filter under it, by whichever process detaches last."""
        from pyroute2 import IPRoute

        with _tc_lock(), IPRoute(netns=netns) if netns else IPRoute() as ipr:
            found = ipr.link_lookup(ifname=ifname)
            if not found:
                raise KernelPlaneError(f"interface `{ifname}` not found{f' in netns {netns}' if netns else ''}")
            idx = found[0]
            try:
                ipr.tc("add", "clsact", idx)
                mark = _clsact_mark(netns, ifname, idx)
                mark.parent.mkdir(exist_ok=True)
                mark.touch()
            except Exception as exc:  # already present: keep it, we only add our filters
                if "File exists" not in str(exc):
                    raise KernelPlaneError(f"adding clsact to `{ifname}`: {exc}") from exc
            self._reap_stale_filters(ipr, idx, ifname)
            added: list[str] = []
            try:
                for fn, parent in ((self._fn_ingress, _TC_INGRESS_PARENT), (self._fn_egress, _TC_EGRESS_PARENT)):
                    ipr.tc("add-filter", "bpf", idx, self._tc_handle, fd=fn.fd, name=fn.name, parent=parent, classid=1,
                           direct_action=True, prio=_TC_PRIO)
                    added.append(parent)
            except Exception as exc:
                self._remove_tc(ipr, _TcAttachment(ifname, idx, netns), added)
                raise KernelPlaneError(f"attaching TC to `{ifname}`: {exc}") from exc
        self._tc.append(_TcAttachment(ifname, idx, netns))

    def _reap_stale_filters(self, ipr: object, idx: int, ifname: str) -> None:
        """Delete filters of ours left by a policyc process that died without detaching
        (SIGKILL): TC filters outlive their process, and each would keep costing every packet.
        A handle names its plane's pid; a live process's filters are never touched."""
        for parent in (_TC_INGRESS_PARENT, _TC_EGRESS_PARENT):
            try:
                found = ipr.get_filters(idx, parent=parent)  # type: ignore[attr-defined]
            except Exception as exc:  # no clsact yet, or the listing is refused: nothing to reap
                log.debug("listing tc filters on %s: %s", ifname, exc)
                continue
            for f in found:
                handle, pid = f["handle"], f["handle"] >> 8
                if f["info"] >> 16 != _TC_PRIO or handle == 0 or pid in (0, os.getpid()) or not pid_gone(pid):
                    continue
                try:
                    ipr.tc("del-filter", "bpf", idx, handle, parent=parent, prio=_TC_PRIO)  # type: ignore[attr-defined]
                    log.warning("removed a TC filter on %s left by policyc process %d, which is gone", ifname, pid)
                except Exception as exc:  # another process reaped it first
                    log.debug("reaping tc filter %#x on %s: %s", handle, ifname, exc)

    def _remove_tc(self, ipr: object, a: _TcAttachment, parents: list[str]) -> None:
        """Delete our filters under `parents`, then the clsact qdisc if policyc added it and no
        filter (policyc's or anyone's) is left under it."""
        for parent in parents:
            try:
                ipr.tc("del-filter", "bpf", a.ifindex, self._tc_handle, parent=parent, prio=_TC_PRIO)  # type: ignore[attr-defined]
            except Exception as exc:  # already gone (the namespace or the qdisc went first)
                log.debug("detach tc %s/%s %s: %s", a.netns, a.ifname, parent, exc)
        mark = _clsact_mark(a.netns, a.ifname, a.ifindex)
        if not mark.exists():
            return
        try:
            left = [f for parent in (_TC_INGRESS_PARENT, _TC_EGRESS_PARENT)
                    for f in ipr.get_filters(a.ifindex, parent=parent)]  # type: ignore[attr-defined]
            if left:
                return
            ipr.tc("del", "clsact", a.ifindex)  # type: ignore[attr-defined]
        except Exception as exc:  # the interface or the namespace is gone, and the qdisc with it
            log.debug("removing clsact from %s/%s: %s", a.netns, a.ifname, exc)
        mark.unlink(missing_ok=True)

    def detach_tc(self, ifname: str = "lo", netns: str | None = None) -> None:
        from pyroute2 import IPRoute

        keep: list[_TcAttachment] = []
        for a in self._tc:
            if a.ifname != ifname or a.netns != netns:
                keep.append(a)
                continue
            try:
                with _tc_lock(), IPRoute(netns=netns) if netns else IPRoute() as ipr:
                    self._remove_tc(ipr, a, [_TC_INGRESS_PARENT, _TC_EGRESS_PARENT])
            except Exception as exc:  # the namespace may be gone already, which detaches too
                log.debug("detach tc %s/%s: %s", netns, ifname, exc)
        self._tc = keep

    def attach_cgroup(self, cgroup: Path) -> None:
        """Redirect connects made from processes in `cgroup` (a cgroup v2 directory)."""
        from bcc import BPF, BPFAttachType

        try:
            fd = os.open(cgroup, os.O_RDONLY)
        except OSError as exc:
            raise KernelPlaneError(f"cgroup `{cgroup}`: {exc.strerror}") from exc
        try:
            BPF.attach_func(self._fn_c4, fd, BPFAttachType.CGROUP_INET4_CONNECT)
            BPF.attach_func(self._fn_c6, fd, BPFAttachType.CGROUP_INET6_CONNECT)
        except Exception as exc:
            os.close(fd)
            raise KernelPlaneError(f"attaching connect hooks to `{cgroup}`: {exc}") from exc
        self._cgroups.append((fd, cgroup))

    def detach_cgroup(self, cgroup: Path) -> None:
        from bcc import BPF, BPFAttachType

        for fd, path in list(self._cgroups):
            if path != cgroup:
                continue
            for fn, kind in ((self._fn_c4, BPFAttachType.CGROUP_INET4_CONNECT), (self._fn_c6, BPFAttachType.CGROUP_INET6_CONNECT)):
                try:
                    BPF.detach_func(fn, fd, kind)
                except Exception as exc:
                    log.debug("detach %s: %s", path, exc)
            os.close(fd)
            self._cgroups.remove((fd, path))

    def attached_programs(self) -> int:
        """BPF programs attached now: two per observed interface (ingress, egress), two per
        cgroup (connect4, connect6). The decision service's metrics read it."""
        return 2 * len(self._tc) + 2 * len(self._cgroups)

    @property
    def cgroup2_root(self) -> Path | None:
        return self._cgroup2

    # ----------------------------------------------------------------- map changes (audited in kernel)

    def _ctl(self, op: MapOp, rule: int = 0, key: Endpoint | None = None, val: Endpoint | None = None, arg: int = 0) -> None:
        from policyc.enforcer.bpf_syscall import prog_test_run

        cmd = CCtlCmd(op=int(op), rule=rule, arg=arg)
        if key is not None:
            cmd.key = CEndpoint.of(key)
        if val is not None:
            cmd.val = CEndpoint.of(val)
        with self._lock:
            err = prog_test_run(self._fn_ctl.fd, bytes(cmd))
        if err and op not in (MapOp.QUARANTINE_DEL, MapOp.BACKEND_DEL, MapOp.RULE_DEL):
            raise KernelPlaneError(f"{op.name.lower()} failed in the kernel: {os.strerror(err)}")

    def quarantine(self, backend: Endpoint, backup: Endpoint, rule: int, until_monotonic_ns: int) -> None:
        """New connects to `backend` go to `backup` until the deadline (enforced by the kernel)."""
        self._ctl(MapOp.QUARANTINE_SET, rule, backend, backup, until_monotonic_ns)

    def release(self, backend: Endpoint) -> None:
        self._ctl(MapOp.QUARANTINE_DEL, 0, backend)

    def quarantined(self) -> dict[Endpoint, Endpoint]:
        out: dict[Endpoint, Endpoint] = {}
        for k, v in self._bpf[b"quarantine"].items():
            key = CEndpoint.from_buffer_copy(bytes(k))
            backup = CEndpoint.from_buffer_copy(bytes(v)[: ct.sizeof(CEndpoint)])
            out[key.endpoint()] = backup.endpoint()
        return out

    def register_backend(self, backend: Endpoint, backend_id: int) -> None:
        self._ctl(MapOp.BACKEND_SET, 0, backend, None, backend_id)
        self._backend_eps.add(backend)

    def unregister_backend(self, backend: Endpoint) -> None:
        self._ctl(MapOp.BACKEND_DEL, 0, backend)
        self._backend_eps.discard(backend)

    def set_tc_drop(self, enabled: bool) -> None:
        """Also drop, at TC egress, packets still flowing to a quarantined backend."""
        self._ctl(MapOp.CONFIG_SET, int(ConfigSlot.TC_DROP_QUARANTINED), arg=int(enabled))

    def apply_rules(self, rules: KernelRules) -> None:
        """Make the rule maps equal `rules` (programs stay loaded; traffic keeps flowing)."""
        self._rule_names = dict(rules.names)
        for idx, budget_ns in rules.budgets_ns.items():
            self._ctl(MapOp.RULE_SET, idx, arg=budget_ns)
        for stale in self._installed_rules - set(rules.budgets_ns):
            self._ctl(MapOp.RULE_DEL, stale)
        self._installed_rules = set(rules.budgets_ns)
        self._ctl(MapOp.CONFIG_SET, int(ConfigSlot.STREAM_BUDGET_NS), arg=rules.stream_budget_ns)

    def rule_budgets(self) -> dict[int, int]:
        return {k.value: v.value for k, v in self._bpf[b"rules"].items()}

    def end_connections(self, backend: Endpoint) -> int:
        """End established TCP connections to `backend` in every attached namespace, as
        `ss -K` would, through sock_diag netlink in this process (`sock_destroy`)."""
        return self.end_connections_many([backend])[backend]

    def end_redirected(self, backend: Endpoint) -> int:
        """End the connections the connect hooks sent from `backend` to its backup (known by
        their socket cookies), so that, its quarantine released, the gateway connects to
        `backend` again instead of keeping them for good; returns how many ended. The backup's
        own connections are left alone."""
        table = self._bpf[b"redirected"]
        mine = [k for k, v in table.items() if CEndpoint.from_buffer_copy(bytes(v)).endpoint() == backend]
        cookies = {k.value for k in mine}
        ended = 0
        if cookies:
            for ns in {a.netns for a in self._tc} or {None}:
                try:
                    ended += end_tcp_by_cookie(cookies, ns)
                except OSError as exc:
                    raise KernelPlaneError(f"ending connections redirected from {backend}{f' in netns {ns}' if ns else ''}: {exc}") from exc
        for k in mine:
            try:
                del table[k]
            except KeyError:
                pass
        return ended

    def end_connections_many(self, backends: Sequence[Endpoint]) -> dict[Endpoint, int]:
        """`end_connections` for several backends, one walk of each namespace's socket table
        (imported with the plane: a first import on a break's path would hold the interpreter)."""
        namespaces = {a.netns for a in self._tc} or {None}
        killed = dict.fromkeys(backends, 0)
        for ns in namespaces:
            try:
                for b, n in end_tcp_to_many(list(killed), ns).items():
                    killed[b] += n
            except OSError as exc:
                names = ", ".join(map(str, list(killed)[:3])) + (" ..." if len(killed) > 3 else "")
                raise KernelPlaneError(f"ending connections to {names}{f' in netns {ns}' if ns else ''}: {exc}") from exc
        return killed

    # ----------------------------------------------------------------- counters

    def flow(self, src: Endpoint, dst: Endpoint, hook: str = "egress", proto: int = 6) -> FlowCounters:
        table = self._bpf[b"flows"]
        mine = CFlowKey(src=CEndpoint.of(src), dst=CEndpoint.of(dst), proto=proto, hook=1 if hook == "egress" else 0)
        key = table.Key.from_buffer_copy(bytes(mine))
        try:
            v = table[key]
        except KeyError:
            return FlowCounters(0, 0, 0)
        return FlowCounters(v.packets, v.bytes, v.payload)

    def backend_counters(self, backend_id: int, hook: str = "egress", toward: bool = True) -> FlowCounters:
        table = self._bpf[b"backend_stats"]
        mine = CBackendKey(id=backend_id, hook=1 if hook == "egress" else 0, toward=int(toward))
        key = table.Key.from_buffer_copy(bytes(mine))
        try:
            v = table[key]
        except KeyError:
            return FlowCounters(0, 0, 0)
        return FlowCounters(v.packets, v.bytes, v.payload)

    def clear_observations(self) -> None:
        """Forget counters and stream state (tests reuse one plane across namespaces)."""
        for name in (b"flows", b"backend_stats", b"h2_dirs", b"h2_streams"):
            self._bpf[name].clear()

    def _halt_poller(self) -> None:
        self._stop.set()
        self._poller.join(timeout=1)

    def close(self) -> None:
        self._halt_poller()
        atexit.unregister(self._halt_poller)
        for _, path in list(self._cgroups):
            self.detach_cgroup(path)
        for a in list(self._tc):
            self.detach_tc(a.ifname, a.netns)


def monotonic_deadline_ns(seconds_from_now: float) -> int:
    """A deadline the kernel compares with bpf_ktime_get_ns (both CLOCK_MONOTONIC)."""
    return time.monotonic_ns() + int(seconds_from_now * 1e9)


KERNEL_EVENT_KINDS = tuple(EventKind)
