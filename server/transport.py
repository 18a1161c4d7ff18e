"""Where the server listens and how: TLS or mutual TLS, plaintext only on loopback unless
the operator opts in explicitly (tokens over plaintext off loopback would be readable), and
an open fleet (`--open-fleet`: no token to change it) on loopback only."""

from __future__ import annotations

import ipaddress

import grpc

from .config import ServeConfig


class TransportError(ValueError):
    """A listening configuration the server refuses, with the reason."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _read(path, what: str) -> bytes:  # type: ignore[no-untyped-def]
    """A TLS file: regular and at most 1 MiB (see compiler/bounded_read.py)."""
    from policyc.compiler import bounded_read

    try:
        return bounded_read.read_bytes(path, 1 << 20, f"the TLS {what}")
    except bounded_read.FileRefused as e:
        raise TransportError(str(e)) from None


def _pem(path, what: str) -> bytes:  # type: ignore[no-untyped-def]
    """A TLS file that parses as what it claims to be, checked here: gRPC given a garbage
    certificate fails later, inside the handshake or with a traceback."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = _read(path, what)
    try:
        if what == "key":
            serialization.load_pem_private_key(data, password=None)
        else:
            x509.load_pem_x509_certificates(data)
    except (ValueError, TypeError) as e:
        raise TransportError(f"{path}: not a PEM TLS {what} ({str(e).split('.')[0][:120]})") from None
    return data


def bind(server: grpc.aio.Server, cfg: ServeConfig) -> int:
    """Add the listening port; returns the bound port number."""
    if not 0 <= cfg.port <= 65535:  # gRPC would silently listen on the port modulo 65536
        raise TransportError(f"port {cfg.port} is out of range (0 to 65535)")
    address = f"[{cfg.host}]:{cfg.port}" if ":" in cfg.host else f"{cfg.host}:{cfg.port}"
    if cfg.open_fleet and not is_loopback(cfg.host):
        raise TransportError(f"refusing --open-fleet on `{cfg.host}`: every caller on the network could change the "
                             "fleet; give tokens (--token operator:…) instead")
    if cfg.tls is not None:
        creds = grpc.ssl_server_credentials(
            [(_pem(cfg.tls.key, "key"), _pem(cfg.tls.cert, "certificate"))],
            root_certificates=_pem(cfg.tls.client_ca, "client CA") if cfg.tls.client_ca else None,
            require_client_auth=cfg.tls.client_ca is not None,
        )
        port = server.add_secure_port(address, creds)
    else:
        if not is_loopback(cfg.host) and not cfg.allow_insecure_remote:
            raise TransportError(f"refusing plaintext on `{cfg.host}`: give --tls-cert/--tls-key, listen on loopback, "
                                 "or opt in with --insecure-plaintext")
        port = server.add_insecure_port(address)
    if port == 0:
        raise TransportError(f"cannot listen on {address}")
    return port
