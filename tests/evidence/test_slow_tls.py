"""Cross-layer correlation from measured data: clients reach the gateway over TLS from a
network namespace the test makes (a veth pair), and the gateway-to-client direction of
that link is shaped in the kernel (a `tbf` token bucket on the host end of the veth: this
kernel has neither `sch_netem` nor `sch_fq`, and a token bucket delays only what overruns
its burst). The gateway's certificate flight overruns it, so Envoy's TLS handshakes really
take over 150 ms on the wire while the model server's measured compute stays a few ms; the
GPU that serves the calls reads 15 % SM utilisation from the stand-in NVML driver (pynvml
against `tests/placer/stand_in_nvml.c`), fed to the windows as `TelemetryLevels` feeds
NVML's readings with `--telemetry local` (the service here runs the simulated cluster). The gateway's access log feeds 10 ms signal windows
and the correlation rules decide "client-side network, not the model": the GPU is not
blamed, not healed. Without the shaper the same calls classify as nothing of the kind."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from evidence_support import REPO, EvidenceRig
from gateway_rig import PRIMARY

from policyc.compiler.bundle import Bundle
from policyc.enforcer.correlate import SM_UTIL
from policyc.enforcer.records import ActionKind

sys.path.insert(0, str(REPO / "tests" / "placer"))
import nvml_stand_in  # noqa: E402

# The gateway's certificate names the tenants it serves (a multi-tenant gateway's
# certificate: SANS subject alternative names, 5.5 KB in DER), so its certificate flight
# overruns the shaper's burst and drains at RATE: measured 206-266 ms per handshake here
# (unshaped: 1-3 ms), against the rule's 150 ms.
SANS = 160
RATE = "224kbit"
BURST = 1600  # bytes: a full-size frame must fit the bucket (tbf drops what cannot)
THRESHOLD_S = 0.150  # the bundle's client-network rule: tls_handshake > 150 ms
CALLS = 4
CLIENT = r"""
import json, sys, grpc
from policyc.modelserver.client import OipClient, token_ids
target, ca = sys.argv[1], open(sys.argv[2], "rb").read()
md = (("x-model", "fraud-scorer"), ("x-data-region", "us-west"), ("x-tenant", "acme-bank"))
out = []
for _ in range(int(sys.argv[3])):  # a new connection, so a new TLS handshake, per call
    ch = grpc.secure_channel(target, grpc.ssl_channel_credentials(ca), options=[("grpc.ssl_target_name_override", "policyc-gateway")])
    with OipClient(ch) as c:
        try:
            out.append(c.infer("fraud-scorer", token_ids(16), metadata=md, timeout=20).decision_id)
        except grpc.RpcError as e:
            sys.exit(f"call {len(out) + 1}: {e.code()}: {e.details()}")
print(json.dumps(out))
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def self_signed(dest: Path, ip: str, tenants: int = SANS) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("policyc-gateway"), x509.IPAddress(ipaddress.ip_address(ip))]
    names += [x509.DNSName(f"tenant-{i:04d}.models.example.net") for i in range(tenants)]
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "policyc-gateway")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(names), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    c, k = dest / "gateway.crt", dest / "gateway.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return c, k


@pytest.fixture(scope="module")
def client_ns() -> Iterator[tuple[str, str, str]]:
    """(namespace, the host end of its veth, the gateway's address on it); removed after."""
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"policyc-tls-{tag}", f"ptls{tag}", f"ptlsc{tag}"
    octet = int(tag[:2], 16) % 250 + 2
    gw_ip, cl_ip = f"10.251.{octet}.1", f"10.251.{octet}.2"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        sh("ip", "addr", "add", f"{gw_ip}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "-n", ns, "addr", "add", f"{cl_ip}/30", "dev", ns_if)
        sh("ip", "-n", ns, "link", "set", ns_if, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield ns, host_if, gw_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        sh("ip", "netns", "del", ns)


@pytest.fixture(scope="module")
def tls_rig(bundle: Bundle, client_ns: tuple[str, str, str]) -> Iterator[tuple[EvidenceRig, Path]]:
    _, _, gw_ip = client_ns
    work = Path(tempfile.mkdtemp(prefix="policyc-slow-tls-"))
    cert, key = self_signed(work, gw_ip)
    r = EvidenceRig(bundle, work, listen_host=gw_ip, tls=(cert, key))
    yield r, cert
    r.stop()


def nvml_sm_util(work: Path) -> float:
    """The GPU's SM utilisation as NVML reports it (the stand-in driver, through pynvml and
    policyc.placer.nvml, in a child whose loader finds the stand-in first)."""
    driver = nvml_stand_in.build(work / "nvml")
    table = work / "nvml" / "devices.txt"
    nvml_stand_in.write_table(table, [nvml_stand_in.Gpu(sm_util=15)])
    return float(nvml_stand_in.run_python(driver, table, "import json\nfrom policyc.placer.nvml import NvmlSource\n"
                                           "print(json.dumps(NvmlSource().readings()[0].sm_util))"))


def calls_from_the_namespace(ns: str, target: str, ca: Path) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, target, str(ca), str(CALLS)],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def classified(rig: EvidenceRig, key: str, since: int) -> list[str]:
    records = rig.thread.server.actions.memory.records[since:]  # type: ignore[union-attr]
    return [r.detail for r in records if r.target == key and r.kind is ActionKind.CLASSIFY]


def handshakes_ms(details: list[dict]) -> list[float]:  # type: ignore[type-arg]
    return [round(d["downstream"]["tls_handshake_s"] * 1e3, 1) for d in details]


def compute_of(detail: dict) -> list[float]:  # type: ignore[type-arg]
    """The model server's measured compute seconds of each attempt that answered."""
    return [a["compute_seconds"] for a in detail["attempts"] if a["compute_seconds"] is not None]


def test_slow_tls_with_low_sm_utilisation_is_client_network_not_the_model(tls_rig, client_ns) -> None:  # type: ignore[no-untyped-def]
    from test_gateway_accounting import accounting_of
    rig, ca = tls_rig
    ns, host_if, _ = client_ns
    [slot] = [s for s in rig.slots if s.model == PRIMARY]
    key = f"{slot.instance.deployment.host}/{slot.instance.deployment.gpu}"
    sm = nvml_sm_util(rig.workdir)
    assert abs(sm - 0.15) < 1e-9
    windows = rig.gateway.signals
    assert windows is not None
    memory = rig.thread.server.actions.memory  # type: ignore[union-attr]

    def run_calls() -> list[dict]:  # type: ignore[type-arg]
        windows.level(key, SM_UTIL, sm, time.time())  # NVML's reading, as TelemetryLevels feeds it with --telemetry local
        ids = calls_from_the_namespace(ns, rig.listen, ca)
        details = [accounting_of(rig, i)["detail"] for i in ids]
        deadline = time.monotonic() + 5  # the windows close `lag` after their last event
        while time.monotonic() < deadline and any(k[0] == key for k in list(windows._open)):
            time.sleep(0.05)
        return details

    # unshaped: handshakes in a few ms, nothing is blamed on the client side
    before = len(memory.records)
    fast = run_calls()
    assert all(d["downstream"]["tls"] and d["downstream"]["tls_handshake_s"] < 0.1 for d in fast), handshakes_ms(fast)
    assert classified(rig, key, before) == []

    # the gateway-to-client direction shaped in the kernel: every certificate flight waits on the bucket
    sh("tc", "qdisc", "add", "dev", host_if, "root", "tbf", "rate", RATE, "burst", str(BURST), "latency", "2s")
    try:
        before = len(memory.records)
        slow = run_calls()
        stats = sh("tc", "-s", "qdisc", "show", "dev", host_if)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", host_if, "root"], capture_output=True)
    assert "qdisc tbf" in stats and "dropped 0" in stats.replace(",", ""), stats  # delayed, not lost: no retransmits
    assert all(h > THRESHOLD_S * 1e3 for h in handshakes_ms(slow)), handshakes_ms(slow)
    # the model's own time, as the model server measured it, stayed small: the delay is on the client's link
    computes = [c for d in slow for c in compute_of(d)]
    assert len(computes) == CALLS and all(c < 0.05 for c in computes), computes
    verdicts = classified(rig, key, before)
    print(f"\nTLS handshakes unshaped {handshakes_ms(fast)} ms, shaped {handshakes_ms(slow)} ms "
          f"(model compute {[round(c * 1e3, 2) for c in computes]} ms); verdicts: {verdicts[:1]}")
    assert len(verdicts) >= 3 and all("cause client_network" in v for v in verdicts), verdicts
    later = memory.records[before:]
    assert any(r.kind is ActionKind.REPORT_ANOMALY and "GPU not blamed" in r.detail for r in later)
    assert not any(r.kind is ActionKind.SELF_HEAL_STEP for r in later)  # the model is not healed
