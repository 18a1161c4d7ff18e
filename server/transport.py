"""Where the server listens and how: TLS or mutual TLS, plaintext only on loopback unless
the operator opts in explicitly (tokens over plaintext off loopback would be readable)."""

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
    try:
        return path.read_bytes()
    except OSError as e:
        raise TransportError(f"{path}: cannot read the TLS {what}: {e.strerror}") from None


def bind(server: grpc.aio.Server, cfg: ServeConfig) -> int:
    """Add the listening port; returns the bound port number."""
    address = f"[{cfg.host}]:{cfg.port}" if ":" in cfg.host else f"{cfg.host}:{cfg.port}"
    if cfg.tls is not None:
        creds = grpc.ssl_server_credentials(
            [(_read(cfg.tls.key, "key"), _read(cfg.tls.cert, "certificate"))],
            root_certificates=_read(cfg.tls.client_ca, "client CA") if cfg.tls.client_ca else None,
            require_client_auth=cfg.tls.client_ca is not None,
        )
        port = server.add_secure_port(address, creds)
    else:
        if not is_loopback(cfg.host) and not cfg.allow_insecure_remote:
            raise TransportError(f"refusing plaintext on `{cfg.host}`: give --tls-cert/--tls-key, listen on loopback, "
                                 "or opt in with --insecure-plaintext")
        if not is_loopback(cfg.host) and cfg.tokens.enabled is False:
            raise TransportError(f"refusing to serve `{cfg.host}` without tokens: every caller would be an operator")
        port = server.add_insecure_port(address)
    if port == 0:
        raise TransportError(f"cannot listen on {address}")
    return port
