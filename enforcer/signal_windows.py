"""Cross-layer signals in short windows (the design's 10 ms), per GPU, for the correlation
rules (`correlate.py`, through `Guardian.observe_gpu`).

Two kinds of signal: *events* (one value per call or stream: the gateway's TLS handshake
time, time to first byte, gRPC status; the kernel walker's per-stream HTTP/2 time),
averaged over the window they fall in, and *levels* (sampled state: NVML's SM
utilisation), whose sample holds until the next: a window gets the last sample taken before
it closed, even when later samples came before it was handed on (a few seconds of samples
are kept for that). A window is handed on once it has
closed and its events have had `lag` seconds to arrive (Envoy's access log is flushed on a
timer); only windows with at least one event are handed on (a level alone is what the
telemetry tick already feeds). The gRPC statuses of a window become `error_rate` (the
share of non-OK calls) and their distribution is kept for the window's record.

`GatewaySignals` is the access-log receiver's listener: each call's TLS handshake, time to
first byte and status, on the GPU of the instance that answered, and the TCP connect time
of each upstream connection Envoy opened to it (`connect_time`, once per connection: calls
that reuse a pooled connection did not connect).

`TelemetryLevels` is the telemetry refresher's listener: each new snapshot's SM utilisation,
as a level, for the GPUs the gateway sends calls to. `policyc gateway` subscribes it when
the service's telemetry is this host's NVML (`--telemetry local`); a simulated cluster's
GPUs are not the ones real model servers run on, so their figures are not mixed into the
correlation of measured traffic (tests feed the level they mean to test by hand).

`KernelStreamSignals` is the kernel plane's ring-buffer listener: each HTTP/2 stream the TC
walker saw end (both sides' END_STREAM) toward a model server of the pool, its kernel-timed
duration as `stream_time` on that server's GPU (a reset stream has no duration to speak of;
streams toward anything else, e.g. the gateway's own listener, are not the model's).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from policyc.enforcer.kernel_abi import EventKind
from policyc.enforcer.correlate import CONNECT_TIME, ERROR_RATE, SM_UTIL, STREAM_TIME, TLS_HANDSHAKE

WINDOW = 0.010  # seconds
LEVEL_KEEP = 1.0  # seconds of level samples kept beyond `lag` + one window, for the windows not yet handed on
MAX_LEVEL_SAMPLES = 4096  # per GPU and signal, whatever the sampling rate
TIME_TO_FIRST_BYTE = "time_to_first_byte"  # seconds, the gateway's view of the model server


@dataclass
class _Open:
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    key: str  # the GPU (`host/gpuN`)
    start: float  # wall-clock seconds
    signals: Mapping[str, float]
    statuses: Mapping[str, int]


class SignalWindows:
    def __init__(self, on_window: Callable[[ClosedWindow], object], window: float = WINDOW, lag: float = 0.5) -> None:
        if window <= 0:
            raise ValueError(f"a signal window must be positive, got {window}")
        self.window, self.lag, self.on_window = window, lag, on_window
        self._open: dict[tuple[str, int], _Open] = {}
        self._levels: dict[str, dict[str, list[tuple[float, float]]]] = {}  # key -> signal -> [(time, value)], by time
        self._lock = threading.Lock()

    def _slot(self, key: str, t: float) -> _Open:
        at = (key, math.floor(t / self.window))
        w = self._open.get(at)  # most events land in a window already open: make one only when not
        if w is None:
            w = self._open[at] = _Open()
        return w

    def event(self, key: str, signal: str, value: float, t: float) -> None:
        with self._lock:
            w = self._slot(key, t)
            w.sums[signal] = w.sums.get(signal, 0.0) + value
            w.counts[signal] = w.counts.get(signal, 0) + 1

    def status(self, key: str, code: str, t: float) -> None:
        with self._lock:
            self._slot(key, t).statuses[code] += 1

    def level(self, key: str, signal: str, value: float, t: float) -> None:
        with self._lock:
            samples = self._levels.setdefault(key, {}).setdefault(signal, [])
            bisect.insort(samples, (t, value))
            # keep the sample that holds at the horizon and every later one
            horizon = samples[-1][0] - (self.lag + self.window + LEVEL_KEEP)
            cut = bisect.bisect_right(samples, (horizon, math.inf)) - 1
            if cut > 0:
                del samples[:cut]
            if len(samples) > MAX_LEVEL_SAMPLES:
                del samples[:len(samples) - MAX_LEVEL_SAMPLES]

    def _level_at(self, key: str, t: float) -> dict[str, float]:
        """Each level's last sample taken at or before `t` (none: the level is unknown then)."""
        out = {}
        for signal, samples in self._levels.get(key, {}).items():
            i = bisect.bisect_right(samples, (t, math.inf))
            if i:
                out[signal] = samples[i - 1][1]
        return out

    def flush(self, now: float) -> list[ClosedWindow]:
        """Hand on every window that closed at least `lag` seconds before `now`, oldest first."""
        with self._lock:
            due = sorted((k for k in self._open if (k[1] + 1) * self.window + self.lag <= now), key=lambda k: k[1])
            out = []
            for k in due:
                w = self._open.pop(k)
                start = k[1] * self.window
                signals = self._level_at(k[0], start + self.window)
                signals.update({s: w.sums[s] / w.counts[s] for s in w.sums})
                n = sum(w.statuses.values())
                if n:
                    signals[ERROR_RATE] = 1.0 - w.statuses.get("0", 0) / n
                out.append(ClosedWindow(k[0], start, signals, dict(w.statuses)))
        for cw in out:
            self.on_window(cw)
        return out


class GatewaySignals:
    """Feeds each call the gateway's access log reports into the windows."""

    def __init__(self, windows: SignalWindows, gpu_of: Callable[[str], str | None]) -> None:
        self.windows = windows
        self.gpu_of = gpu_of  # instance id -> its GPU key
        self._connections: dict[str, None] = {}  # upstream connections whose connect was counted (bounded, oldest out)

    def __call__(self, call: object, attempts: list) -> None:  # type: ignore[type-arg]
        if not attempts or not attempts[-1].instance:
            return
        last = attempts[-1]
        key = self.gpu_of(last.instance)
        if key is None:
            return
        t = call.start + (call.duration or 0.0)  # type: ignore[attr-defined]
        if call.tls_handshake is not None:  # type: ignore[attr-defined]
            self.windows.event(key, TLS_HANDSHAKE, call.tls_handshake, t)  # type: ignore[attr-defined]
        conn = call.upstream_connection  # type: ignore[attr-defined]
        if call.upstream_connect is not None and conn is not None and conn not in self._connections:  # type: ignore[attr-defined]
            self._connections[conn] = None
            if len(self._connections) > 4096:
                del self._connections[next(iter(self._connections))]
            self.windows.event(key, CONNECT_TIME, call.upstream_connect, t)  # type: ignore[attr-defined]
        if last.first_byte is not None:
            self.windows.event(key, TIME_TO_FIRST_BYTE, last.first_byte, t)
        if call.grpc_status is not None:  # type: ignore[attr-defined]
            self.windows.status(key, call.grpc_status, t)  # type: ignore[attr-defined]


class TelemetryLevels:
    """Feeds SM utilisation from each telemetry snapshot into the windows as a level
    (`Refresher.on_refresh`), for the GPU keys `keys()` names (a gateway's pool: windows
    open only for GPUs it sends calls to, and a fleet-wide loop would cost every tick)."""

    def __init__(self, windows: SignalWindows, keys: Callable[[], Iterable[str]]) -> None:
        self.windows = windows
        self.keys = keys
        self.fed = 0
        self.closed = False  # the gateway stopped: the refresher keeps its listeners, this one goes quiet

    def __call__(self, new: object, previous: object) -> None:
        if self.closed:
            return
        topology, frame = new.topology, new.frame  # type: ignore[attr-defined]
        index = topology.gpu_index
        wall = time.time() - (time.monotonic() - new.taken_at)  # type: ignore[attr-defined]  # when it was sampled
        for key in set(self.keys()):
            host, _, gpu = key.rpartition("/")
            i = index.get((host, gpu))
            if i is not None:
                self.windows.level(key, SM_UTIL, float(frame.gpu_sm_util[i]), wall)
                self.fed += 1


class KernelStreamSignals:
    """Feeds the kernel walker's per-stream HTTP/2 times into the windows (`KernelPlane.subscribe`)."""

    def __init__(self, windows: SignalWindows, gpu_of_endpoint: Callable[[str], str | None]) -> None:
        self.windows = windows
        self.gpu_of_endpoint = gpu_of_endpoint  # `ip:port` of a model server -> its GPU key
        self.fed = 0

    def __call__(self, event: object) -> None:
        if event.kind is not EventKind.STREAM_DONE or event.reset:  # type: ignore[attr-defined]
            return
        key = self.gpu_of_endpoint(str(event.b))  # type: ignore[attr-defined]
        if key is None:
            return
        # the event's clock is CLOCK_MONOTONIC; the windows are on wall-clock time like the access log
        t = time.time() - (time.monotonic_ns() - event.ts_ns) / 1e9  # type: ignore[attr-defined]
        self.windows.event(key, STREAM_TIME, event.duration_s, t)  # type: ignore[attr-defined]
        self.fed += 1


__all__ = ["WINDOW", "KernelStreamSignals", "TelemetryLevels", "CONNECT_TIME", "TIME_TO_FIRST_BYTE", "STREAM_TIME", "SignalWindows", "GatewaySignals", "ClosedWindow"]
