"""Port backlog, measured on the host: the queue in front of a GPU's ports as the host's
agent read it from the kernel (the root qdisc's backlog over its limit, `tc -s qdisc`;
`cluster/host_signals.py`), under the measured key of the port (`host/<port>`, a topology
port key) rather than of a GPU.

A GPU is refused when every port it could leave by has a fresh measurement that is over the
port watermark (`Thresholds.max_port_watermark`, the limit the simulator's watermark meets
in `port.py`) or down; the refusal names the backlog and its age. The same measurement is
also written into the frame's port columns (`cluster/measured_hosts.py`), so the buffer
delay and the path search use it as they use the simulator's watermark. A measurement older
than its bound (the reading's own `stale_after_s`, set per host from its agent's period) is
stale: it is not used (FALL_BACK: the model's column stands) and the plan says so.

This file and its line in `signals/__init__.py` are the whole of the signal."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..framework import NOTHING, Column, Signal, Stage, TickInputs, Words
from ..plan import Constraint
from ..readings import Reading, Readings
from ..snapshot import Snapshot
from ..topology import Topology

FRACTION, BYTES, UP, STALE_AFTER, TX = "port_backlog_fraction", "port_backlog_bytes", "port_up", "stale_after_s", "port_tx_Bps"
DEFAULT_STALE_AFTER = 1.0


class PortBacklog(Signal[TickInputs]):
    name = "port_backlog"
    constraint = Constraint.PORT_BACKLOG
    consumes = (FRACTION, BYTES, UP)
    stage = Stage.TICK

    def _ports(self, measured: Readings, t: Topology, limit: float) -> tuple[np.ndarray, np.ndarray]:
        """Per port: (bad: fresh and over the limit or down, stale)."""
        n = len(t.ports)
        bad, stale = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        index = _port_rows(t)
        for key, reading in measured.items():
            p = index.get(key)
            if p is None:
                continue
            state = _state(reading, limit)
            if state == "stale":
                stale[p] = True
            elif state == "bad":
                bad[p] = True
        return bad, stale

    def _gpus(self, x: TickInputs) -> Column:
        measured = x.snap.frame.measured
        if not measured:
            return NOTHING
        t = x.snap.topology
        bad, stale = self._ports(measured, t, x.th.max_port_watermark)
        if not (bad.any() or stale.any()):
            return NOTHING
        local, remote = t.gpu_ports
        lp, rp = local[x.gpus], remote[x.gpus]
        has_l, has_r = lp >= 0, rp >= 0
        bad_l = np.where(has_l, bad[np.where(has_l, lp, 0)], True)
        bad_r = np.where(has_r, bad[np.where(has_r, rp, 0)], True)
        fail = (has_l | has_r) & bad_l & bad_r
        st = (has_l & stale[np.where(has_l, lp, 0)]) | (has_r & stale[np.where(has_r, rp, 0)])
        return Column(fail=fail, stale=st)

    def reference(self, x: TickInputs) -> Column:
        return self._gpus(x)

    def detail(self, w: Words, r: int) -> str:
        g = int(w.ev.gpus[r])
        t = w.snap.topology
        parts = [line for p in _gpu_ports(t, g) if (line := _words(t, p, w.snap.frame.measured, w.th.max_port_watermark))]
        return "measured port backlog: " + "; ".join(parts) if parts else "measured port backlog"

    def plan_note(self, snap: Snapshot, gpu: int) -> str | None:
        t = snap.topology
        parts = [line for p in _gpu_ports(t, gpu) if (line := _words(t, p, snap.frame.measured, snap.thresholds.max_port_watermark))]
        return "measured port backlog: " + "; ".join(parts) if parts else None


def _state(reading: Reading, limit: float) -> str:
    v, age = reading.values, reading.age_s
    if not age <= float(v.get(STALE_AFTER, DEFAULT_STALE_AFTER)):
        return "stale"
    if v.get(UP, 1.0) < 0.5:
        return "bad"
    f = v.get(FRACTION)
    return "bad" if f is not None and f > limit else "ok"


def _words(t: Topology, p: int, measured: Readings, limit: float) -> str | None:
    key = t.port_key(p)
    reading = measured.get(key)
    if reading is None:
        return None
    v, age = reading.values, reading.age_s
    state = _state(reading, limit)
    if state == "stale":
        return (f"{key}: its host's report is {age:.2f} s old (bound {float(v.get(STALE_AFTER, DEFAULT_STALE_AFTER)):g} s), "
                "stale: not used, the modelled watermark stands")
    if v.get(UP, 1.0) < 0.5:
        return f"{key}: link down, measured {age * 1e3:.0f} ms ago"
    f = v.get(FRACTION)
    fill = f" = {f:.0%} of the qdisc's limit" + (f" > {limit:.0%}" if f is not None and f > limit else "") if f is not None else ""
    return f"{key}: qdisc backlog {v.get(BYTES, 0.0):,.0f} B{fill}, measured {age * 1e3:.0f} ms ago"


def _gpu_ports(t: Topology, g: int) -> list[int]:
    local, remote = t.gpu_ports
    return [int(p) for p in (local[g], remote[g]) if p >= 0]


@lru_cache(maxsize=4)
def _port_rows(t: Topology) -> dict[str, int]:
    return {t.port_key(i): i for i in range(len(t.ports))}


__all__ = ["PortBacklog"]
