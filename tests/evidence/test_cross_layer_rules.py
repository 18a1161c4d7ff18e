"""Correlation rules that fire from measured upstream signals, through real Envoy and real
KServe model servers, with 15 % SM utilisation read from the stand-in NVML driver:

- `connect_time`: the primary model server runs in a network namespace behind a veth pair
  whose gateway-to-server direction is congested in the kernel (a `tbf` bucket holding a
  standing queue, `netns_link.py`), so every TCP connect Envoy opens to it takes ~100 ms
  on the wire while the server's measured compute stays sub-millisecond: the rule decides
  "the network between gateway and model server, not the model" from Envoy's measured
  connect times (the access log) and the GPU is not blamed.
- `stream_time`: with `--enforcer kernel`, the TC frame walker times each upstream HTTP/2
  stream; a model server that holds its calls (its stall control, the stand-in for a stuck
  serving process) makes those streams long while its GPU idles: the rule decides "the
  serving process, not the GPU" from the kernel's stream times.

The rules are the test's own (the example policies have no such breakers), compiled with
the example policies into one bundle, as an operator would add them. The service runs the
simulated cluster, whose figures `policyc gateway` keeps out of the windows, so the test
feeds the stand-in NVML's reading as `TelemetryLevels` does with `--telemetry local`."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from evidence_support import REPO, EvidenceRig, signal_events
from gateway_rig import BACKUP, PRIMARY
from netns_link import NetnsServerSpec, StandingQueue, VethLink
from test_gateway_accounting import BASE, IDS, accounting_of
from test_slow_tls import nvml_sm_util

from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.enforcer.correlate import SM_UTIL
from policyc.enforcer.records import ActionKind
from policyc.modelserver.client import OipClient
from policyc.modelserver.specs import ServerSpec
from policyc.server.config import EnforcerMode, Telemetry

RULES = """
# Upstream connects slow while the GPU idles: the link to the model server, not the model.
breaker upstream-network {
  scope: connection
  when: sm_utilization < 20 % and connect_time > 50 ms
  consecutive: 3
  classify: upstream_network
  actions: [report_anomaly]
}

# Upstream streams long while the GPU idles: the serving process holds the calls, not the GPU.
breaker held-by-server {
  scope: connection
  when: sm_utilization < 20 % and stream_time > 80 ms
  consecutive: 3
  classify: serving_process
  actions: [report_anomaly]
}
"""
# A fraud-scorer call is broken at 185 ms (`slo-budget`) and retried on the backup,
# fraud-scorer-lite, which has no budget. So the far model server is the backup's, called by
# name: a call through the congested link waits there several times (its SYN, then its
# request), and nothing breaks it. The held calls of the stream-time test stay inside the
# primary's 185 ms.
RATE_BIT = 2_000_000
QUEUE_S = 0.100  # what every packet toward the model server waits behind the standing queue
HOLD_MS = 100  # how long the model server holds each call in the stream-time test
CALLS = 4
FAR = tuple((k, BACKUP if k == "x-model" else v) for k, v in BASE)


def without_breaker(text: str, name: str) -> str:
    """A contract file's text without one `breaker NAME { ... }` block."""
    start = text.index(f"breaker {name} {{")
    depth, i = 0, text.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return text[:start] + text[i:]


@pytest.fixture(scope="module")
def rules_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """The example policies, less `slow-placement` (it retries a call at 300 % of its predicted
    15-35 ms, so a call held 50 ms would never finish on the primary), plus the rules above."""
    d = tmp_path_factory.mktemp("rules")
    for f in (REPO / "policies").glob("*.contract"):
        text = f.read_text()
        (d / f.name).write_text(without_breaker(text, "slow-placement") if f.name == "breakers.contract" else text)
    (d / "cross-layer.contract").write_text(RULES)
    r = compile_paths([str(d)], analyse=False)
    assert r.ok and r.bundle is not None, [str(x) for x in r.errors]
    assert {b.name for b in r.bundle.breakers} >= {"slo-budget", "client-network", "upstream-network", "held-by-server"}
    assert "slow-placement" not in {b.name for b in r.bundle.breakers}
    return r.bundle


def gpu_key(rig: EvidenceRig, model: str = PRIMARY) -> str:
    [slot] = [s for s in rig.slots if s.model == model]
    return f"{slot.instance.deployment.host}/{slot.instance.deployment.gpu}"


def verdicts(rig: EvidenceRig, key: str, since: int) -> list[str]:
    records = rig.thread.server.actions.memory.records[since:]  # type: ignore[union-attr]
    return [r.detail for r in records if r.target == key and r.kind is ActionKind.CLASSIFY]


def settle(rig: EvidenceRig, key: str) -> None:
    """Wait until the windows holding the calls have been handed to the rules (`lag` after they close)."""
    windows = rig.gateway.signals
    assert windows is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(k[0] == key for k in list(windows._open)):
        time.sleep(0.05)


@pytest.fixture(scope="module")
def far_rig(rules_bundle: Bundle) -> Iterator[tuple[EvidenceRig, VethLink]]:
    link = VethLink("pcxl")
    try:
        def place(model: str, spec: ServerSpec) -> ServerSpec:
            if model != BACKUP:
                return spec
            return NetnsServerSpec(spec.instances, spec.stall_control, host=link.ns_ip, netns=link.ns)

        rig = EvidenceRig(rules_bundle, Path(tempfile.mkdtemp(prefix="policyc-far-model-")), place=place)
        try:
            yield rig, link
        finally:
            rig.stop()
    finally:
        link.close()


def test_slow_upstream_connects_with_an_idle_gpu_are_the_network_not_the_model(far_rig: tuple[EvidenceRig, VethLink]) -> None:
    rig, link = far_rig
    key, sm = gpu_key(rig, BACKUP), nvml_sm_util(rig.workdir)
    [slot] = [s for s in rig.slots if s.model == BACKUP]
    host, _, port = rig.models.endpoint(slot.instance_id).rpartition(":")
    assert host == link.ns_ip  # the backup serves from the namespace
    windows, memory = rig.gateway.signals, rig.thread.server.actions.memory  # type: ignore[union-attr]
    assert windows is not None

    def run_calls() -> list[dict]:  # type: ignore[type-arg]
        out = []
        with OipClient(rig.listen) as client:
            for _ in range(CALLS):
                windows.level(key, SM_UTIL, sm, time.time())  # NVML's reading, as TelemetryLevels feeds it with --telemetry local
                a = client.infer(BACKUP, IDS, metadata=FAR, timeout=10)
                assert a.instance == slot.instance_id, a.instance
                out.append(accounting_of(rig, a.decision_id)["detail"])
                link.end_connections_to(int(port))  # the next call opens a new upstream connection
                time.sleep(0.1)  # Envoy has seen it close
        settle(rig, key)
        return out

    before = len(memory.records)
    fast = run_calls()
    connects = lambda details: [round(d["downstream"]["upstream_connect_s"] * 1e3, 1) for d in details]  # noqa: E731
    assert all(c < 5 for c in connects(fast)), connects(fast)
    assert verdicts(rig, key, before) == []

    link.shape(RATE_BIT)
    try:
        with StandingQueue(link, RATE_BIT, QUEUE_S):
            before = len(memory.records)
            slow = run_calls()
    finally:
        stats = link.unshape()
    assert "dropped 0" in stats.replace(",", ""), stats  # delayed, never lost: no SYN was retransmitted
    assert all(50 < c < 200 for c in connects(slow)), connects(slow)
    computes = [a["compute_seconds"] for d in slow for a in d["attempts"]]
    assert len(computes) == CALLS and all(c is not None and c < 0.05 for c in computes), computes
    found = verdicts(rig, key, before)
    print(f"\nupstream connect unshaped {connects(fast)} ms, congested {connects(slow)} ms "
          f"(model compute {[round(c * 1e3, 2) for c in computes]} ms); verdicts: {found[:1]}")
    assert len(found) >= 3 and all("cause upstream_network" in v for v in found), found
    later = memory.records[before:]
    assert any(r.kind is ActionKind.REPORT_ANOMALY and r.rule == "upstream-network" and "GPU not blamed" in r.detail for r in later)
    assert not any(r.kind is ActionKind.SELF_HEAL_STEP for r in later)


@pytest.fixture(scope="module")
def kernel_rig(rules_bundle: Bundle) -> Iterator[EvidenceRig]:
    r = EvidenceRig(rules_bundle, Path(tempfile.mkdtemp(prefix="policyc-stream-time-")), enforcer=EnforcerMode.KERNEL)
    yield r
    r.stop()


def test_long_kernel_timed_streams_with_an_idle_gpu_are_the_serving_process_not_the_gpu(kernel_rig: EvidenceRig) -> None:
    rig = kernel_rig
    key, sm = gpu_key(rig), nvml_sm_util(rig.workdir)
    windows, memory = rig.gateway.signals, rig.thread.server.actions.memory  # type: ignore[union-attr]
    g = rig.thread.server.guardian
    assert windows is not None and g is not None and rig.gateway.kernel_streams is not None
    def run_calls(n: int, extra: tuple[tuple[str, str], ...]) -> list[dict]:  # type: ignore[type-arg]
        out = []
        with OipClient(rig.listen) as client:
            for _ in range(n):
                windows.level(key, SM_UTIL, sm, time.time())
                a = client.infer(PRIMARY, IDS, metadata=BASE + extra, timeout=10)
                out.append(accounting_of(rig, a.decision_id)["detail"])
                time.sleep(0.05)  # one call per window
        g.plane.drain()  # type: ignore[attr-defined]
        settle(rig, key)
        return out

    with OipClient(rig.listen) as client:  # Envoy's upstream connection opens; the walker follows it from then on
        client.infer(PRIMARY, IDS, metadata=BASE, timeout=10)
    g.plane.drain()  # type: ignore[attr-defined]
    with signal_events(windows) as events:  # what the walker fed, as the rules got it
        def stream_times() -> list[float]:
            return [v for k, signal, v in events if k == key and signal == "stream_time"]

        before = len(memory.records)
        # two quick calls only: at 15 % SM utilisation, windows nothing explains count toward the
        # GPU's own sm-collapse rule (10 in a row), which would take it out of placement
        run_calls(2, ())
        quick = stream_times()
        assert len(quick) == 2 and all(s < 0.02 for s in quick), quick
        assert verdicts(rig, key, before) == []
        before, events[:] = len(memory.records), []
        held = run_calls(CALLS, (("x-policyc-stall-ms", str(HOLD_MS)),))
        seen = stream_times()
    assert len(seen) == CALLS and all(HOLD_MS / 1e3 <= s < HOLD_MS / 1e3 + 0.1 for s in seen), seen
    computes = [a["compute_seconds"] for d in held for a in d["attempts"]]
    assert len(computes) == CALLS and all(c is not None and c < 0.05 for c in computes), computes
    found = verdicts(rig, key, before)
    print(f"\nkernel stream times quick {[round(s * 1e3, 2) for s in quick]} ms, held {[round(s * 1e3, 1) for s in seen]} ms "
          f"(model compute {[round(c * 1e3, 2) for c in computes]} ms); verdicts: {found[:1]}")
    assert len(found) >= 3 and all("cause serving_process" in v for v in found), found
    later = memory.records[before:]
    assert any(r.kind is ActionKind.REPORT_ANOMALY and r.rule == "held-by-server" and "GPU not blamed" in r.detail for r in later)


@pytest.mark.parametrize("telemetry", [Telemetry.LOCAL, Telemetry.SIMULATED])
def test_the_gateway_feeds_measured_sm_utilisation_to_its_windows_only(telemetry: Telemetry, rules_bundle: Bundle,
                                                                       tmp_path: Path) -> None:
    """`policyc gateway --telemetry local`: the service's refresher hands every snapshot's SM
    utilisation (NVML's, on a GPU host) to the gateway's windows (`TelemetryLevels`, tested
    end to end from the stand-in NVML in tests/enforcer/test_signal_windows.py); on the
    simulated cluster nothing is fed; a stopped gateway's listener goes quiet."""
    from policyc.enforcer.signal_windows import TelemetryLevels
    from policyc.gateway.runner import Gateway, GatewayOptions
    from policyc.server.app import DecisionServer, ServerThread
    from policyc.server.config import ServeConfig

    th = ServerThread(DecisionServer(rules_bundle, ServeConfig(telemetry=telemetry, audit_log=tmp_path / "audit.db",
                                                               enforcer=EnforcerMode.USERSPACE)))
    th.start()
    try:
        gw = Gateway(th, GatewayOptions(workdir=tmp_path / "gw"))
        listeners = th.server.refresher._listeners
        if telemetry is Telemetry.SIMULATED:
            assert gw.telemetry_levels is None and not any(isinstance(f, TelemetryLevels) for f in listeners)
            return
        assert gw.telemetry_levels is not None and gw.telemetry_levels in listeners
        assert gw.telemetry_levels.windows is gw.signals
        gw.stop()
        assert gw.telemetry_levels.closed
    finally:
        th.stop()
