"""The hosts' measured signals in the decision service: each host agent's latest report
(`signals/<host>`, watched by every replica: `HostSignalBook`) merged into the placer's
telemetry with each value's age (`HostMeasured`, a telemetry source wrapping the
service's own).

For each host of the topology whose agent reported:

- its ports' columns (`port_watermark`, `port_util`, `port_up`) become the measured ones:
  the watermark is the root qdisc's backlog over its limit, the utilisation the bytes sent
  per second over the port's bandwidth, up the interface's operstate. A topology port named
  like one of the host's interfaces takes that interface's figures; a host whose ports are
  named otherwise (the simulated `mlx5_N` of a namespace host with one `eth0`) has its
  uplinks' worst figures on each of its ports (fullest queue, any link down); the uplinks
  are the interfaces the agent marks as such (its default route's, or those with a routable
  address: a down `ifb0` or spare NIC is not one), else all but loopback;
- each session store the agent probes (`session_probe.py`) is a reading under the store's
  endpoint name (`host/numa0/nvme`) with its own age (since the agent timed it) and bound
  (at least three probe intervals): the placer's dependency table takes its `read_s` as the
  store's latency while fresh (`placer/stores.measured_latency`);
- the measured readings carry each port's figures under its port key (`host/mlx5_0`,
  read by `placer/signals/port_backlog.py`, which names them and their age in refusals
  and plans), and the host's disk latencies, model-server CPU, RSS and run-queue delay and
  the agent's own period and jitter under the host's name.

The age is the time since the agent sampled (its wall clock: hosts are expected to keep
NTP time; a report from the future counts as age 0). A report older than its bound
(`stale_ticks` of the agent's own period, at least `min_stale_s`) is stale: the host's
columns keep the model's values, the frame's notes say so, and the port readings are kept
with their age so the signal can say why it fell back.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from policyc.placer.readings import Reading
from policyc.placer.telemetry import TelemetryFrame, TelemetrySource
from policyc.placer.topology import Topology

from .host_signals import backlog_fraction

log = logging.getLogger("policyc.cluster")
MAX_REPORT_BYTES = 256 * 1024
MAX_ENTRIES = 64


@dataclass(frozen=True)
class HostReport:
    host: str
    time: float  # the agent's wall clock when it sampled
    period_s: float
    interfaces: Mapping[str, Mapping[str, float]]
    disks: Mapping[str, Mapping[str, float]]
    processes: Mapping[str, Mapping[str, float]]
    agent: Mapping[str, float]
    sessions: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)  # `numaN/kind` -> read_s, write_s, time, …

    def age(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.time)

    @classmethod
    def parse(cls, host: str, raw: bytes) -> "HostReport":
        """ValueError naming the problem for what is not a report (bounded size and counts,
        numbers only)."""
        if len(raw) > MAX_REPORT_BYTES:
            raise ValueError(f"signals of {host}: {len(raw)} bytes (at most {MAX_REPORT_BYTES})")
        try:
            body = json.loads(raw)
            t = float(body["time"])
            agent = _numbers(body.get("agent") or {}, "agent")
            period = float(agent.get("period_s", 0.2))
            if not (math.isfinite(t) and 0.001 <= period <= 3600):
                raise ValueError("time or period out of range")
            return cls(host, t, period, _table(body.get("interfaces") or {}, "interfaces"), _table(body.get("disks") or {}, "disks"),
                       _table(body.get("processes") or {}, "processes"), agent, _table(body.get("sessions") or {}, "sessions"))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"signals of {host}: not a report ({e})") from None
        except ValueError as e:
            raise ValueError(f"signals of {host}: {e}") from None


def _numbers(d: Any, what: str) -> dict[str, float]:
    if not isinstance(d, dict) or len(d) > MAX_ENTRIES:
        raise ValueError(f"{what}: an object of at most {MAX_ENTRIES} numbers")
    out = {}
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{what}.{k}: not a number")
        out[str(k)[:64]] = float(v)
    return out


def _table(d: Any, what: str) -> dict[str, dict[str, float]]:
    if not isinstance(d, dict) or len(d) > MAX_ENTRIES:
        raise ValueError(f"{what}: an object of at most {MAX_ENTRIES} entries")
    return {str(k)[:64]: _numbers(v, f"{what}.{k}") for k, v in d.items()}


class HostSignalBook:
    """Each host's latest report, as the replica's watch delivers them."""

    def __init__(self, *, stale_ticks: float = 5.0, min_stale_s: float = 1.0) -> None:
        self.stale_ticks, self.min_stale_s = stale_ticks, min_stale_s
        self.reports: dict[str, HostReport] = {}
        self.refused: dict[str, str] = {}  # host -> why its last report was not taken
        self.received = 0
        self.rejected: dict[str, int] = {}  # host -> reports not taken, ever (for status and tests)
        self.last_refusal: dict[str, str] = {}  # host -> why the last one not taken was not (kept after a good one)
        self.verified: dict[str, int] = {}  # host -> signed reports taken

    def on_report(self, host: str, raw: bytes, verify: Callable[[bytes], str] | None = None) -> None:
        """Take `host`'s report; with `verify` (an enrolled host: `signed_reports.py`) only a
        report whose signature verifies and that is later than the last one taken."""
        try:
            if verify is not None and (why := verify(raw)):
                raise ValueError(f"signals of {host}: {why}")
            rep = HostReport.parse(host, raw)
            last = self.reports.get(host)
            if verify is not None and last is not None and rep.time <= last.time:
                raise ValueError(f"signals of {host}: taken at {rep.time:.3f}, not after the last report taken "
                                 f"({last.time:.3f}): a replayed report")
        except ValueError as e:
            if self.refused.get(host) != str(e):
                log.warning("%s", e)
            self.refused[host] = self.last_refusal[host] = str(e)
            self.rejected[host] = self.rejected.get(host, 0) + 1
            return
        if verify is not None:
            self.verified[host] = self.verified.get(host, 0) + 1
        self.refused.pop(host, None)
        self.reports[host] = rep
        self.received += 1

    def forget(self, host: str) -> None:
        self.reports.pop(host, None)

    def stale_after(self, rep: HostReport) -> float:
        return max(self.min_stale_s, self.stale_ticks * rep.period_s)

    def status(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Per host: age, stale or not, the agent's own period and jitter (for status and tests)."""
        out: dict[str, dict[str, Any]] = {}
        for h, r in self.reports.items():
            age = r.age(now)
            out[h] = {"age_s": round(age, 3), "stale": age > self.stale_after(r), "stale_after_s": self.stale_after(r),
                      **{k: r.agent[k] for k in ("period_mean_s", "jitter_s", "cpu_per_tick_s") if k in r.agent}}
        for h, why in self.refused.items():
            out.setdefault(h, {})["refused"] = why
        return out


def _uplinks(rep: HostReport) -> dict[str, Mapping[str, float]]:
    """The host's uplinks: those its agent marks as such (`uplink`), else every interface
    but loopback (an agent that does not know them)."""
    ifs = {n: v for n, v in rep.interfaces.items() if n != "lo"}
    if any("uplink" in v for v in ifs.values()):
        return {n: v for n, v in ifs.items() if v.get("uplink") == 1.0}
    return ifs


def _port_figures(v: Mapping[str, float]) -> tuple[float | None, float, float, float]:
    """(fill fraction or None, backlog bytes, tx bytes/s, up) of one interface."""
    return backlog_fraction(v), v.get("backlog_bytes", 0.0), v.get("tx_Bps", 0.0), v.get("up", 1.0)


class HostMeasured:
    """`source`'s topology and frames, with the hosts' measured signals merged in (see the
    module's docstring)."""

    def __init__(self, source: TelemetrySource, book: HostSignalBook, clock: Callable[[], float] = time.time) -> None:
        self.name = f"{source.name}+hosts"
        self._source, self.book, self._clock = source, book, clock
        self._stale_said: set[str] = set()
        self._host_keys: tuple[str, ...] = ()  # the readings the last sample merged in

    def topology(self) -> Topology:
        return self._source.topology()

    @property
    def remeasure(self) -> Callable[[TelemetryFrame], TelemetryFrame] | None:
        """The wrapped source's way to take its readings again (`measured.WithReadings`, the
        model servers'), with the hosts' kept as the last sample merged them: they also set
        the frame's port telemetry, which changes only with a sample (`refresher.Refresher`).
        None where the wrapped source has none (the refresher then samples every tick)."""
        inner = getattr(self._source, "remeasure", None)
        if inner is None:
            return None

        def remeasure(frame: TelemetryFrame) -> TelemetryFrame:
            hosts = {k: frame.measured[k] for k in self._host_keys if k in frame.measured}
            fresh = inner(frame)
            return dataclasses.replace(fresh, measured=MappingProxyType({**fresh.measured, **hosts}))

        return remeasure

    def sample(self) -> TelemetryFrame:
        frame = self._source.sample()
        reports = dict(self.book.reports)
        self._host_keys = ()
        if not reports:
            return frame
        t = self._source.topology()
        now = self._clock()
        wm, util, up = frame.port_watermark.copy(), frame.port_util.copy(), frame.port_up.copy()
        readings: dict[str, Reading] = {}
        notes: list[str] = []
        ports_of: dict[int, list[int]] = {}
        for i, info in enumerate(t.ports):
            ports_of.setdefault(info.host, []).append(i)
        for host, rep in reports.items():
            hi = t.host_index.get(host)
            if hi is None:
                continue
            age, bound = rep.age(now), self.book.stale_after(rep)
            stale = age > bound
            if stale:
                notes.append(f"host {host}: its agent's last report is {age:.2f} s old (bound {bound:g} s): not used")
                if host not in self._stale_said:
                    log.warning("host %s: its agent's signals are %.2f s old (bound %g s): not used", host, age, bound)
                    self._stale_said.add(host)
            else:
                self._stale_said.discard(host)
            ups = _uplinks(rep)
            for p in ports_of.get(hi, []):
                name = t.ports[p].name
                figs = [_port_figures(rep.interfaces[name])] if name in rep.interfaces else [_port_figures(v) for v in ups.values()]
                if not figs:
                    continue
                fracs = [f for f, _, _, _ in figs if f is not None]
                frac = max(fracs) if fracs else None
                backlog, tx, link_up = max(b for _, b, _, _ in figs), max(x for _, _, x, _ in figs), min(u for _, _, _, u in figs)
                values = {"port_backlog_bytes": backlog, "port_tx_Bps": tx, "port_up": link_up, "stale_after_s": bound}
                if frac is not None:
                    values["port_backlog_fraction"] = frac
                readings[t.port_key(p)] = Reading(MappingProxyType(values), age)
                if stale:
                    continue
                if frac is not None:
                    wm[p] = frac
                bw = t.ports[p].bandwidth
                if bw > 0:
                    util[p] = min(1.0, tx / bw)
                up[p] = link_up >= 0.5
            for key, v in rep.sessions.items():  # the session stores, under their endpoints' names
                if "read_s" not in v:
                    continue
                when = v.get("time", rep.time)
                s_age = max(0.0, now - when) if math.isfinite(when) else age
                readings[f"{host}/{key}"] = Reading(MappingProxyType(
                    {**v, "stale_after_s": max(bound, 3.0 * v.get("interval_s", 0.0))}), s_age)
            flat: dict[str, float] = {"stale_after_s": bound}
            for group, table in (("disk", rep.disks), ("process", rep.processes)):
                for name, v in table.items():
                    for k, x in v.items():
                        flat[f"{group}.{name}.{k}"] = x
            for k, x in rep.agent.items():
                flat[f"agent.{k}"] = x
            readings[host] = Reading(MappingProxyType(flat), age)
        self._host_keys = tuple(readings)
        measured = MappingProxyType({**frame.measured, **readings})
        return dataclasses.replace(frame, port_watermark=wm, port_util=util, port_up=np.asarray(up, dtype=bool),
                                   measured=measured, notes=frame.notes + tuple(notes))


__all__ = ["HostMeasured", "HostReport", "HostSignalBook"]
