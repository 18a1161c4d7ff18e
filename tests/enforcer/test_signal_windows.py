"""The 10 ms signal windows: events averaged per window, gRPC statuses as an error rate,
levels (NVML's SM utilisation) carried forward, windows handed on only after their lag."""

from __future__ import annotations

import pytest

from policyc.enforcer.correlate import ERROR_RATE, SM_UTIL, TLS_HANDSHAKE
from policyc.enforcer.signal_windows import ClosedWindow, SignalWindows


def test_events_are_averaged_per_window_and_levels_carry_forward() -> None:
    got: list[ClosedWindow] = []
    w = SignalWindows(got.append, window=0.01, lag=0.5)
    w.level("h/gpu0", SM_UTIL, 0.15, 100.000)
    w.event("h/gpu0", TLS_HANDSHAKE, 0.2, 100.001)
    w.event("h/gpu0", TLS_HANDSHAKE, 0.4, 100.009)
    w.event("h/gpu0", TLS_HANDSHAKE, 0.01, 100.012)  # the next window
    for code in ("0", "0", "0", "14"):
        w.status("h/gpu0", code, 100.005)
    assert w.flush(100.3) == []  # not yet: the access log may still be delivering
    first, second = w.flush(100.6)
    assert first.signals[TLS_HANDSHAKE] == pytest.approx(0.3) and first.signals[SM_UTIL] == 0.15
    assert first.signals[ERROR_RATE] == pytest.approx(0.25) and first.statuses == {"0": 3, "14": 1}
    assert second.signals[TLS_HANDSHAKE] == pytest.approx(0.01) and second.signals[SM_UTIL] == 0.15
    assert ERROR_RATE not in second.signals
    assert [c.start for c in got] == [first.start, second.start] and second.start - first.start == pytest.approx(0.01)


def test_a_level_sampled_after_a_window_does_not_reach_back_into_it() -> None:
    w = SignalWindows(lambda _: None, window=0.01, lag=0.0)
    w.event("g", TLS_HANDSHAKE, 0.2, 10.001)
    w.level("g", SM_UTIL, 0.9, 10.5)
    [cw] = w.flush(11.0)
    assert SM_UTIL not in cw.signals


def test_a_window_handed_on_after_a_newer_level_sample_gets_the_sample_of_its_own_time() -> None:
    """NVML is sampled more often than the windows' lag: a window handed on later still
    carries the level that held while it was open."""
    w = SignalWindows(lambda _: None, window=0.01, lag=0.5)
    for i, t in enumerate((10.0, 10.1, 10.2, 10.3)):
        w.level("g", SM_UTIL, 0.1 * (i + 1), t)
        w.event("g", TLS_HANDSHAKE, 0.2, t + 0.001)
    got = w.flush(11.0)
    assert [round(c.signals[SM_UTIL], 3) for c in got] == [0.1, 0.2, 0.3, 0.4]
    for i in range(10_000):  # a long run keeps only the samples a window can still need
        w.level("g", SM_UTIL, 0.5, 20.0 + i * 0.01)
    assert len(w._levels["g"][SM_UTIL]) <= (w.lag + w.window + 1.0) / 0.01 + 2


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        SignalWindows(lambda _: None, window=0)


def test_nvml_sm_utilisation_reaches_the_windows_through_the_telemetry_snapshot(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What `policyc gateway` subscribes with `--telemetry local`: NVML (the stand-in driver,
    through pynvml, NvmlSource and LocalHostSource) -> the refresher's snapshot ->
    TelemetryLevels -> the window of a TLS event on that GPU, in a child whose loader finds
    the stand-in first."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "placer"))
    import nvml_stand_in

    driver = nvml_stand_in.build(tmp_path / "nvml")
    table = tmp_path / "nvml" / "devices.txt"
    nvml_stand_in.write_table(table, [nvml_stand_in.Gpu(sm_util=15), nvml_stand_in.Gpu(bus_id="00000000:5E:00.0", sm_util=70)])
    got = nvml_stand_in.run_python(driver, table, """
import json, time
from policyc.placer import LocalHostSource, NvmlSource
from policyc.placer.refresher import Refresher
from policyc.enforcer.signal_windows import SignalWindows, TelemetryLevels
r = Refresher(LocalHostSource(nvml=NvmlSource(), hostname="node-a"), 0.2)
windows = SignalWindows(lambda w: None, lag=0.0)
levels = TelemetryLevels(windows, lambda: ["node-a/gpu0", "node-a/gpu1", "node-b/gpu0"])
r.on_refresh(levels)
r.tick()
now = time.time()
windows.event("node-a/gpu0", "tls_handshake", 0.2, now)
windows.event("node-a/gpu1", "tls_handshake", 0.2, now)
out = {w.key: dict(w.signals) for w in windows.flush(now + 1)}
levels.closed = True
r.tick()
print(json.dumps({"windows": out, "fed": levels.fed}))
""")
    assert got["windows"]["node-a/gpu0"]["sm_utilization"] == 0.15 and got["windows"]["node-a/gpu1"]["sm_utilization"] == 0.70
    assert got["fed"] == 2  # node-b is not in this host's telemetry; closed after the first tick
