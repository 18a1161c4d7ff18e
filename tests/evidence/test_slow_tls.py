"""Cross-layer correlation from measured data: clients reach the gateway over TLS from a
network namespace the test makes (a veth pair), through a relay in that namespace that
holds every client-to-gateway byte for DELAY_MS (this kernel has neither `sch_netem` nor
`sch_fq`, so the delay cannot be a qdisc here), so Envoy's TLS handshakes really take over
200 ms; the GPU that serves
them reads 15 % SM utilisation from the stand-in NVML driver (pynvml against
`tests/placer/stand_in_nvml.c`). The gateway's access log feeds 10 ms signal windows and
the correlation rules decide "client-side network, not the model": the GPU is not blamed,
not healed. Without the delay the same calls classify as nothing of the kind."""

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

DELAY_MS = 220
CALLS = 4
RELAY = r"""
import asyncio, sys, time
host, port, delay, listen = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1e3, int(sys.argv[4])
async def late(reader, writer):  # client -> gateway: each chunk leaves `delay` after it arrived, in order
    q = asyncio.Queue()
    async def out():
        while (item := await q.get()) is not None:
            due, data = item
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        writer.close()
    task = asyncio.create_task(out())
    while data := await reader.read(65536):
        q.put_nowait((time.monotonic() + delay, data))
    q.put_nowait(None)
    await task
async def now(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()
async def serve(cr, cw):
    gr, gw = await asyncio.open_connection(host, port)
    await asyncio.gather(late(cr, gw), now(gr, cw), return_exceptions=True)
async def main():
    srv = await asyncio.start_server(serve, "127.0.0.1", listen)
    print("ready", flush=True)
    await srv.serve_forever()
asyncio.run(main())
"""
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


def self_signed(dest: Path, ip: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "policyc-gateway")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("policyc-gateway"), x509.IPAddress(ipaddress.ip_address(ip))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    c, k = dest / "gateway.crt", dest / "gateway.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return c, k


@pytest.fixture(scope="module")
def client_ns() -> Iterator[tuple[str, str, str]]:
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
        yield ns, ns_if, gw_ip
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


def test_slow_tls_with_low_sm_utilisation_is_client_network_not_the_model(tls_rig, client_ns) -> None:  # type: ignore[no-untyped-def]
    rig, ca = tls_rig
    ns, ns_if, _ = client_ns
    [slot] = [s for s in rig.slots if s.model == PRIMARY]
    key = f"{slot.instance.deployment.host}/{slot.instance.deployment.gpu}"
    sm = nvml_sm_util(rig.workdir)
    assert abs(sm - 0.15) < 1e-9
    windows = rig.gateway.signals
    assert windows is not None
    memory = rig.thread.server.actions.memory  # type: ignore[union-attr]

    def run_calls(target: str) -> list[dict]:  # type: ignore[type-arg]
        windows.level(key, SM_UTIL, sm, time.time())  # NVML's reading of the serving GPU
        ids = calls_from_the_namespace(ns, target, ca)
        from test_gateway_accounting import accounting_of
        details = [accounting_of(rig, i)["detail"]["downstream"] for i in ids]
        deadline = time.monotonic() + 5  # the windows close `lag` after their last event
        while time.monotonic() < deadline and any(k[0] == key for k in list(windows._open)):
            time.sleep(0.05)
        return details

    # fast network: handshakes in a few ms, nothing is blamed on the client side
    before = len(memory.records)
    fast = run_calls(rig.listen)
    assert all(d["tls"] and d["tls_handshake_s"] is not None and d["tls_handshake_s"] < 0.1 for d in fast), fast
    assert classified(rig, key, before) == []

    # the client side's bytes delayed on their way to the gateway: every TLS handshake takes over 200 ms
    gw_host, _, gw_port = rig.listen.rpartition(":")
    relay_port = 20000 + int(uuid.uuid4().hex[:3], 16)
    relay = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", RELAY, gw_host, gw_port, str(DELAY_MS), str(relay_port)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None and relay.stdout.readline().strip() == "ready"
        before = len(memory.records)
        slow = run_calls(f"127.0.0.1:{relay_port}")
    finally:
        relay.terminate()
        relay.wait(5)
    assert all(d["tls_handshake_s"] >= DELAY_MS / 1e3 * 0.9 for d in slow), [d["tls_handshake_s"] for d in slow]
    verdicts = classified(rig, key, before)
    print(f"\nTLS handshakes fast {[round(d['tls_handshake_s'] * 1e3, 2) for d in fast]} ms, "
          f"slow {[round(d['tls_handshake_s'] * 1e3, 1) for d in slow]} ms; verdicts: {verdicts[:1]}")
    assert len(verdicts) >= 3 and all("cause client_network" in v for v in verdicts), verdicts
    later = memory.records[before:]
    assert any(r.kind is ActionKind.REPORT_ANOMALY and "GPU not blamed" in r.detail for r in later)
    assert not any(r.kind is ActionKind.SELF_HEAL_STEP for r in later)  # the model is not healed
