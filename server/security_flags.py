"""The security flags of every command that serves the decision API (`policyc serve`,
`policyc gateway`, replicas with `--etcd`), declared once, and the configuration they make.

    --token ROLE:TOKEN        a bearer token and its role (client, auditor, operator); repeatable
    --open-fleet              anyone may change the fleet and the bundle (loopback only; a warning)
    --tls-cert/--tls-key      serve TLS; --tls-client-ca: mutual TLS
    --insecure-plaintext      plaintext off loopback (not advised)
    --audit-log/--audit-key/--audit-durability   the audit log, its signing key, when a decision is acknowledged
    --endpoint-network CIDR   RegisterInstance: endpoints only in these networks (default: the topology's hosts)
    --host-address HOST=IP    an address of HOST beside those its topology source knows

Without `--token operator:…` and `--open-fleet`, the service makes an operator token and
keeps it in its state dir (`operator_token.py`), which the CLI on the same machine reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from .auth import Role, Tokens
from .config import AuditDurability, TlsFiles
from .endpoint_rules import parse_host_addresses, parse_networks


def add_security_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (who may call what, TLS, the audit log)")
    g.add_argument("--token", action="append", default=[], metavar="ROLE:TOKEN",
                   help="bearer token and its role (client, auditor, operator); repeatable. Without an operator token "
                        "the service makes one in its state dir (mode 0600), which the CLI on this machine reads")
    g.add_argument("--open-fleet", action="store_true",
                   help="let any caller register, deregister and reload without a token (loopback only; logged as a "
                        "warning: every process of every user on this machine could change the fleet)")
    g.add_argument("--tls-cert", help="server certificate (PEM); serves TLS with --tls-key")
    g.add_argument("--tls-key", help="the certificate's private key (PEM)")
    g.add_argument("--tls-client-ca", help="require client certificates signed by this CA (mutual TLS)")
    g.add_argument("--insecure-plaintext", action="store_true", help="allow plaintext off loopback (not advised)")
    g.add_argument("--audit-log", help="append decisions and actions to this audit log")
    g.add_argument("--audit-durability", choices=("group", "sync"), default="group",
                   help="acknowledge a decision at once, its record durable within 50 ms plus a commit (group, the default), "
                        "or only once its record is on disk (sync)")
    g.add_argument("--audit-key", help="ed25519 private key (PEM, `policyc keygen`) that signs the audit log's checkpoints")
    g.add_argument("--endpoint-network", action="append", default=[], metavar="CIDR",
                   help="RegisterInstance: accept endpoints only in this network; repeatable (default: the addresses "
                        "of the topology's hosts)")
    g.add_argument("--host-address", action="append", default=[], metavar="HOST=IP",
                   help="RegisterInstance: IP is an address of HOST, beside those its topology source knows (a site's "
                        "inventory); an endpoint must be an address of the host whose facts it claims; repeatable")


def security_config(args: Any, check_key: Callable[[str], object] | None = None) -> dict[str, Any]:
    """The flags' part of `ServeConfig` (keyword arguments), or ValueError naming a bad flag.
    `check_key(path)` reads the audit key now (the CLI's loader: a bad key is a usage error
    before anything starts), raising ValueError."""
    tokens = Tokens.parse(args.token)
    if args.open_fleet and tokens.has(Role.OPERATOR):
        raise ValueError("--open-fleet makes every caller an operator: an operator --token would change nothing")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("give both --tls-cert and --tls-key")
    if args.tls_client_ca and not args.tls_cert:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
    if args.audit_key:
        if not args.audit_log:
            raise ValueError("--audit-key signs the audit log's checkpoints: give --audit-log too")
        if check_key is not None:
            check_key(args.audit_key)
    tls = TlsFiles(Path(args.tls_cert), Path(args.tls_key), Path(args.tls_client_ca) if args.tls_client_ca else None) \
        if args.tls_cert else None
    return {"tokens": tokens, "open_fleet": args.open_fleet, "tls": tls, "allow_insecure_remote": args.insecure_plaintext,
            "audit_log": Path(args.audit_log) if args.audit_log else None,
            "audit_key": Path(args.audit_key) if args.audit_key else None,
            "audit_durability": AuditDurability(args.audit_durability),
            "endpoint_networks": tuple(str(n) for n in parse_networks(args.endpoint_network)),
            "host_addresses": parse_host_addresses(args.host_address)}
