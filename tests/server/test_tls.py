"""TLS and mutual TLS on a real server: a client that trusts the CA talks to it, a
plaintext client does not get through, and with a client CA configured a client without
a certificate signed by it is refused; tokens ride on the encrypted channel. The
certificates are made here (a CA, a server certificate for localhost / 127.0.0.1, and a
client certificate), so nothing depends on files outside the test."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_rig import SMALL, start

from policyc.client import operator_channel
from policyc.server.auth import Tokens
from policyc.server.config import ServeConfig, TlsFiles
from policyc.server.proto import pb, pb_grpc


def _cert(subject: str, key, issuer_name: x509.Name, issuer_key, *, ca: bool, sans=()) -> x509.Certificate:  # type: ignore[no-untyped-def]
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem_key(key) -> bytes:  # type: ignore[no-untyped-def]
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "policyc test CA")])
    ca = _cert("policyc test CA", ca_key, ca_name, ca_key, ca=True)
    srv_key, cli_key, rogue_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    srv = _cert("localhost", srv_key, ca_name, ca_key, ca=False,
                sans=(x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))))
    cli = _cert("auditor-client", cli_key, ca_name, ca_key, ca=False)
    rogue_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rogue-client")])
    rogue = _cert("rogue-client", rogue_key, rogue_name, rogue_key, ca=False)  # self-signed: not from the CA
    files = {"ca": ca.public_bytes(serialization.Encoding.PEM), "srv.crt": srv.public_bytes(serialization.Encoding.PEM),
             "srv.key": _pem_key(srv_key), "cli.crt": cli.public_bytes(serialization.Encoding.PEM),
             "cli.key": _pem_key(cli_key), "rogue.crt": rogue.public_bytes(serialization.Encoding.PEM),
             "rogue.key": _pem_key(rogue_key)}
    for name, data in files.items():
        (d / name).write_bytes(data)
    return {name: d / name for name in files}


def _secure(port: int, pki: dict[str, Path], client: str | None = None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki[f"{client}.key"].read_bytes() if client else None,
        certificate_chain=pki[f"{client}.crt"].read_bytes() if client else None,
    )
    return grpc.secure_channel(f"localhost:{port}", creds)


def _serving(ch: grpc.Channel) -> bool:
    h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    return h.status == health_pb2.HealthCheckResponse.SERVING


def test_tls_serves_clients_that_trust_the_ca_and_carries_tokens(bundle, pki) -> None:  # type: ignore[no-untyped-def]
    tokens = Tokens.parse(["client:client-secret", "auditor:audit-secret"])
    th = start(bundle, ServeConfig(cluster=SMALL, tokens=tokens, start_refresher=False,
                                   tls=TlsFiles(cert=pki["srv.crt"], key=pki["srv.key"])))
    try:
        port = th.server.port
        with _secure(port, pki) as ch:
            assert _serving(ch)
            s = pb_grpc.DecisionsStub(ch)
            req = pb.DecideRequest(headers={"X-Model": "fraud-scorer-lite"})
            d = s.Decide(req, metadata=(("authorization", "Bearer client-secret"),), timeout=10)
            assert d.outcome == pb.ADMITTED
            with pytest.raises(grpc.RpcError) as info:
                s.Decide(req, metadata=(("authorization", "Bearer audit-secret"),), timeout=10)
            assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
        with operator_channel(f"127.0.0.1:{port}") as plain:  # plaintext to a TLS port gets nowhere
            with pytest.raises(grpc.RpcError) as info:
                health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        th.stop()


def test_mutual_tls_refuses_clients_without_a_certificate_from_the_client_ca(bundle, pki) -> None:  # type: ignore[no-untyped-def]
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False,
                                   tls=TlsFiles(cert=pki["srv.crt"], key=pki["srv.key"], client_ca=pki["ca"])))
    try:
        port = th.server.port
        with _secure(port, pki, client="cli") as ch:
            assert _serving(ch)
            d = pb_grpc.DecisionsStub(ch).Decide(pb.DecideRequest(headers={"X-Model": "fraud-scorer-lite"}), timeout=10)
            assert d.outcome == pb.ADMITTED
        for client in (None, "rogue"):  # no certificate; a certificate the client CA did not sign
            with _secure(port, pki, client=client) as ch:
                with pytest.raises(grpc.RpcError) as info:
                    _serving(ch)
                assert info.value.code() is grpc.StatusCode.UNAVAILABLE, client
    finally:
        th.stop()


def test_an_unreadable_certificate_is_named(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from policyc.server.app import DecisionServer, ServerThread
    from policyc.server.transport import TransportError

    missing = tmp_path / "nope.crt"
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, start_refresher=False,
                                                         tls=TlsFiles(cert=missing, key=missing))))
    with pytest.raises(TransportError, match=f"{missing}: cannot read the TLS key"):
        th.start()
    th.loop.call_soon_threadsafe(th.loop.stop)
