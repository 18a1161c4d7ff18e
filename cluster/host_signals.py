"""What a host agent measures on its own host, every tick, read from the kernel:

- per interface: throughput (bytes/s out and in, from the deltas of
  `/sys/class/net/<if>/statistics/{tx,rx}_bytes`), the root qdisc's backlog (bytes and
  packets, from rtnetlink's `TCA_STATS_QUEUE` through pyroute2: what `tc -s qdisc` prints)
  and its limit where the qdisc has one in bytes (tbf) or packets (pfifo, fq_codel, …), and
  whether the link is up (operstate), and whether it is one of the host's uplinks (`uplink`,
  where the agent knows them: `host_facts.uplinks`);
- per block device: request latency over the tick (`/proc/diskstats`: the milliseconds
  spent on reads and writes divided by the requests completed in the tick; no request, no
  figure);
- per watched process (a model server, named by the operator or by the agent that started
  it): CPU seconds per second and RSS (`/proc/PID/stat`, `/proc/PID/statm`) and its
  run-queue delay (`/proc/PID/schedstat`: seconds spent runnable but waiting for a CPU, per
  second, summed over its threads' shares as the kernel keeps them for the process);
- per session store the agent was given (`numaN/kind`): the read and write latency of a
  session's state there, as `session_probe.py` last timed it (with the time it did).

Nothing here is a constant: a figure the kernel does not give (a device without a queue
limit, a process gone) is absent from the sample, never guessed.

    c = Collector({"vllm-0": 4242})
    c.sample()     # the first sample has levels only; rates from the second on
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from .session_probe import SessionProbe

SOURCE = {
    "throughput": "/sys/class/net/<if>/statistics/{tx,rx}_bytes deltas",
    "backlog": "rtnetlink qdisc stats (TCA_STATS_QUEUE) of the root qdisc, as `tc -s qdisc` shows",
    "disk_latency": "/proc/diskstats: (ms reading + ms writing) / requests completed, per tick",
    "process": "/proc/PID/stat (utime+stime), /proc/PID/statm (RSS), /proc/PID/schedstat (run-queue wait)",
    "session_store": "a session's state written (fsync) and read back (page cache dropped) in the store's directory, timed",
}
TC_H_ROOT = 0xFFFFFFFF
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_DEVICES = 64  # bounded reports: a host with more interfaces or disks reports the first 64 of each


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass
class _Prev:
    t: float
    net: dict[str, tuple[int, int]] = field(default_factory=dict)  # if -> (tx_bytes, rx_bytes)
    disk: dict[str, tuple[int, int]] = field(default_factory=dict)  # dev -> (requests, ms)
    proc: dict[int, tuple[float, float]] = field(default_factory=dict)  # pid -> (cpu s, run-queue wait s)


class Collector:
    """One host's kernel readings, with rates over the time since the previous sample."""

    def __init__(self, processes: Mapping[str, int] | None = None, *, sys_root: str = "/sys", proc_root: str = "/proc",
                 sessions: "SessionProbe | None" = None) -> None:
        self.processes: dict[str, int] = dict(processes or {})
        self.sessions = sessions  # the session stores' latency, probed in its own thread (`session_probe.py`)
        self.uplinks: frozenset[str] | None = None  # set: each interface's reading says whether it is one (`uplink`)
        self.sys, self.proc = Path(sys_root), Path(proc_root)
        self._prev: _Prev | None = None
        self._ipr: Any = None

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    # ---------------------------------------------------------------- interfaces
    def _qdiscs(self) -> dict[int, dict[str, float]]:
        """Per interface index: the root qdisc's backlog bytes and packets, drops and limit,
        and `fill`, the fullest of its qdiscs that have a limit (a classful root such as
        prio or htb has none itself: its shaped class's tbf or fifo does)."""
        if self._ipr is None:
            from pyroute2 import IPRoute

            self._ipr = IPRoute()
        out: dict[int, dict[str, float]] = {}
        fills: dict[int, float] = {}
        for q in self._ipr.get_qdiscs():
            kind = str(q.get_attr("TCA_KIND") or "")
            stats = q.get_attr("TCA_STATS2")
            queue: dict[str, Any] = {}
            if stats is not None:
                queue = dict(next((v for k, v in stats["attrs"] if k == "TCA_STATS_QUEUE"), {}) or {})
            got: dict[str, float] = {"backlog_bytes": float(queue.get("backlog", 0)), "backlog_packets": float(queue.get("qlen", 0)),
                                     "drops": float(queue.get("drops", 0))}
            opts = q.get_attr("TCA_OPTIONS")
            limit = _limit(kind, opts)
            if limit is not None:
                got[limit[0]] = float(limit[1])
                f = backlog_fraction(got)
                if f is not None:
                    ix = int(q["index"])
                    fills[ix] = max(fills.get(ix, 0.0), f)
            if q["parent"] != TC_H_ROOT:
                continue
            got["qdisc_" + kind] = 1.0  # its kind, as a key (values are numbers)
            out[int(q["index"])] = got
        for ix, f in fills.items():
            if ix in out:
                out[ix]["fill"] = f
        return out

    def _interfaces(self, dt: float | None, prev: _Prev | None, now: _Prev) -> dict[str, dict[str, float]]:
        try:
            qd = self._qdiscs()
        except Exception:  # noqa: BLE001 - no rtnetlink here (a container without it): the byte counters still count
            qd = {}
        out: dict[str, dict[str, float]] = {}
        net = self.sys / "class" / "net"
        try:
            names = sorted(p.name for p in net.iterdir())[:MAX_DEVICES]
        except OSError:
            return out
        for name in names:
            d = net / name
            tx, rx = _read_int(d / "statistics" / "tx_bytes"), _read_int(d / "statistics" / "rx_bytes")
            if tx is None or rx is None:
                continue
            now.net[name] = (tx, rx)
            try:
                state = (d / "operstate").read_text().strip()
            except OSError:
                state = "unknown"
            v: dict[str, float] = {"up": 1.0 if state in ("up", "unknown") else 0.0}
            if self.uplinks is not None:
                v["uplink"] = 1.0 if name in self.uplinks else 0.0
            if dt and prev is not None and name in prev.net:
                ptx, prx = prev.net[name]
                v["tx_Bps"], v["rx_Bps"] = max(0, tx - ptx) / dt, max(0, rx - prx) / dt
            ix = _read_int(d / "ifindex")
            if ix is not None and ix in qd:
                v.update(qd[ix])
            out[name] = v
        return out

    # ---------------------------------------------------------------- disks
    def _disks(self, dt: float | None, prev: _Prev | None, now: _Prev) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        try:
            lines = (self.proc / "diskstats").read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            f = line.split()
            if len(f) < 14 or f[2].startswith(("loop", "ram")):
                continue
            name = f[2]
            try:
                reads, ms_r, writes, ms_w = int(f[3]), int(f[6]), int(f[7]), int(f[10])
            except ValueError:
                continue
            now.disk[name] = (reads + writes, ms_r + ms_w)
            if len(out) >= MAX_DEVICES:
                continue
            v: dict[str, float] = {}
            if dt and prev is not None and name in prev.disk:
                n0, ms0 = prev.disk[name]
                n, ms = reads + writes - n0, ms_r + ms_w - ms0
                v["iops"] = max(0, n) / dt
                if n > 0:
                    v["latency_s"] = max(0, ms) / n / 1e3
            out[name] = v
        return out

    # ---------------------------------------------------------------- processes
    def _process(self, pid: int, dt: float | None, prev: _Prev | None, now: _Prev) -> dict[str, float] | None:
        base = self.proc / str(pid)
        try:
            stat = (base / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)
            rss = int((base / "statm").read_text().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None  # gone, or not readable: no figure
        wait = 0.0
        try:
            wait = int((base / "schedstat").read_text().split()[1]) / 1e9  # the main thread's run-queue wait
            tasks = base / "task"
            wait = sum(int((t / "schedstat").read_text().split()[1]) for t in tasks.iterdir()) / 1e9
        except (OSError, ValueError, IndexError):
            pass
        now.proc[pid] = (cpu, wait)
        v = {"rss_bytes": float(rss), "cpu_s_total": cpu}
        if dt and prev is not None and pid in prev.proc:
            c0, w0 = prev.proc[pid]
            v["cpu_per_s"] = max(0.0, cpu - c0) / dt
            v["runq_wait_per_s"] = max(0.0, wait - w0) / dt
        return v

    # ---------------------------------------------------------------- one sample
    def sample(self) -> dict[str, Any]:
        """One sample: levels, and rates over the time since the previous one."""
        t = time.monotonic()
        prev = self._prev
        now = _Prev(t)
        dt = (t - prev.t) if prev is not None else None
        procs = {}
        for name, pid in list(self.processes.items())[:MAX_DEVICES]:
            got = self._process(pid, dt, prev, now)
            if got is not None:
                procs[name] = got
        out = {"interfaces": self._interfaces(dt, prev, now), "disks": self._disks(dt, prev, now), "processes": procs}
        if self.sessions is not None:
            out["sessions"] = self.sessions.latest()
        self._prev = now
        return out


def _limit(kind: str, opts: Any) -> tuple[str, int] | None:
    """A root qdisc's queue limit: ("limit_bytes", n) for tbf, ("limit_packets", n) for the
    packet-counted ones; None where the qdisc has no single limit (noqueue, mq, …)."""
    if kind in ("pfifo", "bfifo") and isinstance(opts, str):  # struct tc_fifo_qopt { __u32 limit; }, as hex bytes
        try:
            raw = bytes.fromhex(opts.replace(":", ""))
        except ValueError:
            return None
        return ("limit_packets" if kind == "pfifo" else "limit_bytes", int.from_bytes(raw[:4], "little")) if len(raw) >= 4 else None
    if opts is None or not hasattr(opts, "get_attr"):
        return None
    try:
        if kind == "tbf":
            parms = opts.get_attr("TCA_TBF_PARMS")
            return ("limit_bytes", int(parms["limit"])) if parms else None
        if kind in ("fq_codel", "fq", "codel", "pie", "fq_pie"):
            for attr in ("TCA_FQ_CODEL_LIMIT", "TCA_FQ_PLIMIT", "TCA_CODEL_LIMIT", "TCA_PIE_LIMIT", "TCA_FQ_PIE_LIMIT"):
                v = opts.get_attr(attr)
                if v:
                    return ("limit_packets", int(v))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return None


def backlog_fraction(v: Mapping[str, float]) -> float | None:
    """The queue's fill (0..1) from an interface's reading: its fullest limited qdisc's
    (`fill`), else the backlog over the qdisc's own limit (bytes, else packets); None where
    no qdisc has a limit to be a fraction of."""
    if "fill" in v:
        return min(1.0, max(0.0, v["fill"]))
    if v.get("limit_bytes"):
        return min(1.0, v.get("backlog_bytes", 0.0) / v["limit_bytes"])
    if v.get("limit_packets"):
        return min(1.0, v.get("backlog_packets", 0.0) / v["limit_packets"])
    return None


__all__ = ["SOURCE", "Collector", "backlog_fraction"]
