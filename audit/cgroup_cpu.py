"""CPU-seconds of a call, measured by the kernel rather than told by the model server.

The model server reports its own compute time (`x-policyc-compute-us`); an auditor wants a
figure from someone else. The kernel counts every cgroup's CPU time (`cpu.stat`
`usage_usec`, cgroup v2), and `policyc`'s launcher starts each model-server process in a
cgroup of its own (`modelserver/cgroup_place.py`), so the serving process's CPU over a
call's span is a measured total. What one call used is then a share of it:

**The rule** (stated in every figure's `method`): the serving process's cgroup is sampled
every `interval` seconds; a call gets, of the CPU used in each sample interval, its overlap
with the interval over the larger of the interval's length and the calls' total overlap
with it: `du * overlap / max(interval, sum of overlaps)`. A call alone gets the CPU of the
time it spans (idle work of the process included); concurrent calls split it by time.
Calls are known from the gateway's access log, which holds each record `CPU_HOLD` seconds
(`gateway/access_log.py`) so that the calls overlapping it and ending soon after it are
logged too; a concurrent call still running then does not count, so under overlap with a
much longer call the share is an upper bound. The figure is `apportioned`, source `cgroup`.

Which cgroup serves an endpoint is found from the kernel, not from the registrant: the
process holding the listening socket of the endpoint's port (`/proc/net/tcp{,6}` and
`/proc/PID/fd`), and that process's cgroup (`/proc/PID/cgroup`). Only a process on this
host, in this network namespace, is found; for the others no figure is made (the record
keeps the model server's own measure, labelled as such).

GPU time the same way, where NVML is (`nvml_process.py`): the driver's per-process SM
samples of the cgroup's processes, summed into GPU-seconds, apportioned by the same rule
(`apportion_gpu`, method `nvml: …`).

Sampling starts when an endpoint is first seen (its first call has no samples before it,
so it gets no cgroup figure). Samples are kept `keep` seconds, spans as long.
"""

from __future__ import annotations

import bisect
import ipaddress
import logging
import os
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from .nvml_process import METHOD as GPU_METHOD, NvmlProcessGpu

log = logging.getLogger("policyc.audit.cgroup_cpu")

INTERVAL = 0.02  # seconds between samples of a cgroup's cpu.stat
KEEP = 120.0  # seconds of samples and spans kept
SOURCE = "cgroup"
LOOK_AGAIN = 30.0  # seconds before an endpoint whose process was not found here is looked for again
TCP_LISTEN = "0A"


RULE = ("a call gets du * overlap / max(interval, sum of the overlapping calls' overlaps) of each interval "
        "(calls the gateway had logged by this record's hold)")
GPU_EVERY = 5  # NVML is polled every this many CPU samples (100 ms at the default interval)


def method_text(interval: float) -> str:
    return f"{SOURCE}: cpu.stat usage_usec of the serving process's cgroup, sampled every {interval * 1e3:.0f} ms; {RULE}"


def read_usage_seconds(cgroup: Path) -> float:
    """A cgroup's CPU time so far, seconds (`cpu.stat` `usage_usec`); OSError when unreadable."""
    with open(cgroup / "cpu.stat", "rb") as f:
        for line in f.read(4096).splitlines():
            if line.startswith(b"usage_usec "):
                return int(line.split()[1]) / 1e6
    raise OSError(f"{cgroup}/cpu.stat has no usage_usec")


def cgroup2_root() -> Path | None:
    """Where cgroup v2 is mounted (`/sys/fs/cgroup/unified` on hybrid hosts), from mountinfo."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def cgroup_of_pid(pid: int, root: Path | None = None) -> Path | None:
    """The cgroup v2 directory a process is in (None: gone, or no cgroup2)."""
    root = root or cgroup2_root()
    if root is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return root / line[3:].lstrip("/")
    except OSError:
        return None
    return None


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in host order)."""
    raw = bytes.fromhex(hex_ip)
    words = b"".join(struct.pack("=I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(words)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _listening_inodes(ip: str, port: int) -> set[str]:
    """Inodes of the sockets listening on `ip`:`port` (or on every address, at `port`)."""
    try:
        want = ipaddress.ip_address(ip.strip("[]"))
    except ValueError:
        return set()
    out: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) <= 9 or parts[3] != TCP_LISTEN:
                continue
            hex_ip, _, hex_port = parts[1].rpartition(":")
            if int(hex_port, 16) != port:
                continue
            local = _address(hex_ip)
            if local == want or local.is_unspecified:
                out.add(parts[9])
    return out


def pid_listening_on(ip: str, port: int) -> int | None:
    """The process holding a listening TCP socket on `ip`:`port` in this network namespace."""
    inodes = {f"socket:[{i}]" for i in _listening_inodes(ip, port)}
    if not inodes:
        return None
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
            except OSError:
                continue
    return None


def split_endpoint(endpoint: str) -> tuple[str, int] | None:
    """`ip:port` (or `[v6]:port`) as its parts; None when it is not one."""
    host, _, port = endpoint.rpartition(":")
    return (host, int(port)) if host and port.isdigit() and 0 < int(port) < 65536 else None


@dataclass
class _Watched:
    cgroup: Path
    times: deque[float] = field(default_factory=deque)
    usage: deque[float] = field(default_factory=deque)
    spans: deque[tuple[float, float, str]] = field(default_factory=deque)  # (start, end, key), by arrival
    gpu_times: deque[float] = field(default_factory=deque)  # NVML's GPU-seconds of its processes so far
    gpu_usage: deque[float] = field(default_factory=deque)


def share(times: list[float], values: list[float], spans: list[tuple[float, float, str]],
          start: float, end: float, key: str) -> float | None:
    """The call `key`'s share of a cumulative series over [start, end] by the rule above
    (None when the samples do not cover the span)."""
    if len(times) < 2 or end <= start or times[0] > start or times[-1] < end:
        return None
    i = bisect.bisect_right(times, start) - 1
    j = bisect.bisect_left(times, end)
    total = 0.0
    for k in range(i, j):
        a, b = times[k], times[k + 1]
        du = values[k + 1] - values[k]
        if du <= 0 or b <= a:
            continue
        mine = min(b, end) - max(a, start)
        if mine <= 0:
            continue
        covered = sum(max(0.0, min(b, e) - max(a, s)) for s, e, other in spans if other != key) + mine
        total += du * mine / max(b - a, covered)
    return total


class CgroupCpuMeter:
    """Samples the cgroups of the endpoints it is shown and apportions their CPU to calls."""

    def __init__(self, interval: float = INTERVAL, keep: float = KEEP, root: Path | None = None,
                 gpu: NvmlProcessGpu | None = None, gpu_every: int = GPU_EVERY) -> None:
        """`gpu`: NVML's per-process sampler (`nvml_process.open_nvml()`), polled every
        `gpu_every` samples; None: no GPU figures."""
        self.interval = interval
        self.gpu = gpu
        self.gpu_every = gpu_every
        self.gpu_method = f"{GPU_METHOD}; {RULE}" if gpu is not None else None
        self.keep = keep
        self.root = root or cgroup2_root()
        self.method = method_text(interval)
        self._by_endpoint: dict[str, _Watched | None] = {}  # None: looked for, not found here
        self._by_cgroup: dict[Path, _Watched] = {}
        self._asked: set[str] = set()
        self._missing: dict[str, float] = {}  # endpoint -> when its process was last looked for and not found
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.root is not None

    # ------------------------------------------------------------------ sampling thread
    def start(self) -> CgroupCpuMeter:
        if self._thread is None and self.available:
            self._thread = threading.Thread(target=self._run, name="policyc-cgroup-cpu", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self.interval):
            self._resolve_asked()
            now = time.time()
            with self._lock:
                watched = list(self._by_cgroup.values())
            tick += 1
            if self.gpu is not None and tick % self.gpu_every == 0:
                self._sample_gpu(watched, now)
            for w in watched:
                try:
                    u = read_usage_seconds(w.cgroup)
                except (OSError, ValueError):
                    self._gone(w)  # the process ended and its cgroup went: its endpoints are looked for anew
                    continue
                with self._lock:
                    w.times.append(now)
                    w.usage.append(u)
                    while w.times and w.times[0] < now - self.keep:
                        w.times.popleft()
                        w.usage.popleft()
                    while w.spans and w.spans[0][1] < now - self.keep:
                        w.spans.popleft()

    def _sample_gpu(self, watched: list[_Watched], now: float) -> None:
        """Each watched cgroup's GPU-seconds so far: NVML's per-process figures of its processes."""
        gpu = self.gpu
        assert gpu is not None
        try:
            gpu.poll()
        except Exception as e:  # noqa: BLE001 - a driver error stops GPU figures, never the CPU ones
            log.warning("NVML per-process utilisation failed (%s): no GPU figures from now on", e)
            self.gpu = None
            return
        live: set[int] = set()
        for w in watched:
            try:
                pids = {int(p) for p in (w.cgroup / "cgroup.procs").read_text().split()}
            except OSError:
                continue
            live |= pids
            total = sum(gpu.gpu_seconds.get(p, 0.0) for p in pids)
            with self._lock:
                if w.gpu_usage and total < w.gpu_usage[-1]:
                    total = w.gpu_usage[-1]  # a process left: the cgroup's total does not go back
                w.gpu_times.append(now)
                w.gpu_usage.append(total)
                while w.gpu_times and w.gpu_times[0] < now - self.keep:
                    w.gpu_times.popleft()
                    w.gpu_usage.popleft()
        gpu.forget(live)

    def _resolve_asked(self) -> None:
        with self._lock:
            asked, self._asked = self._asked, set()
        for endpoint in asked:  # /proc scans here, never on the caller's (serving) loop
            parts = split_endpoint(endpoint)
            pid = pid_listening_on(*parts) if parts is not None else None
            cg = cgroup_of_pid(pid, self.root) if pid is not None else None
            with self._lock:
                if cg is None or cg == self.root:
                    # not found here, or not in a cgroup of its own: its cgroup's CPU is not its alone
                    self._by_endpoint[endpoint] = None
                    self._missing[endpoint] = time.monotonic()
                    continue
                w = self._by_cgroup.get(cg) or _Watched(cg)
                self._by_cgroup[cg] = w
                self._by_endpoint[endpoint] = w
                log.info("cgroup CPU: %s is pid %d in %s", endpoint, pid, cg)

    def _gone(self, w: _Watched) -> None:
        with self._lock:
            self._by_cgroup.pop(w.cgroup, None)
            for endpoint in [e for e, v in self._by_endpoint.items() if v is w]:
                del self._by_endpoint[endpoint]

    # ------------------------------------------------------------------ calls
    def note(self, endpoint: str, start: float, end: float, key: str) -> bool:
        """A call's span on `endpoint` (wall-clock seconds); False when its process is not
        (yet) watched. The first sight of an endpoint starts looking for its cgroup."""
        with self._lock:
            missing = self._missing.get(endpoint)
            if endpoint not in self._by_endpoint or (missing is not None and time.monotonic() - missing > LOOK_AGAIN):
                self._by_endpoint[endpoint] = None
                self._missing.pop(endpoint, None)
                self._asked.add(endpoint)
                return False
            w = self._by_endpoint[endpoint]
            if w is None:
                return False
            w.spans.append((start, end, key))
            return True

    def forget(self, endpoint: str) -> None:
        """Look for `endpoint`'s process again at its next call (e.g. a restarted server)."""
        with self._lock:
            self._by_endpoint.pop(endpoint, None)

    def covered(self, endpoint: str, end: float) -> bool:
        """Whether `endpoint`'s samples reach `end` (or it is not watched: nothing to wait for)."""
        with self._lock:
            w = self._by_endpoint.get(endpoint)
            return w is None or (bool(w.times) and w.times[-1] >= end)

    def apportion(self, endpoint: str, start: float, end: float, key: str) -> float | None:
        """The call's share of its process's CPU over [start, end] by the rule above; None
        when the process is not watched or the samples do not cover the span yet."""
        with self._lock:
            w = self._by_endpoint.get(endpoint)
            if w is None:
                return None
            times, usage = list(w.times), list(w.usage)
            spans = [s for s in w.spans if s[0] < end and s[1] > start]
        return share(times, usage, spans, start, end, key)

    def apportion_gpu(self, endpoint: str, start: float, end: float, key: str) -> float | None:
        """The call's share of its process's GPU-seconds (NVML) over [start, end], by the
        same rule; None without NVML or samples covering the span."""
        with self._lock:
            w = self._by_endpoint.get(endpoint)
            if w is None or self.gpu is None:
                return None
            times, usage = list(w.gpu_times), list(w.gpu_usage)
            spans = [s for s in w.spans if s[0] < end and s[1] > start]
        return share(times, usage, spans, start, end, key)
