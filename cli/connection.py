"""What every command that talks to a running decision service shares: the connection flags,
the client (`policyc.client`), and one way to report a failed call (text or one JSON
document) with one exit code per kind of failure."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from policyc.client import ClientError, DecisionClient, Unavailable

from .exit_codes import Exit

DEFAULT_SERVER = "127.0.0.1:50051"


def add_connection_flags(p: argparse.ArgumentParser, *, with_format: bool = True) -> None:
    p.add_argument("--server", default=os.environ.get("POLICYC_SERVER", DEFAULT_SERVER),
                   help=f"host:port of the decision service (default: $POLICYC_SERVER or {DEFAULT_SERVER})")
    p.add_argument("--token", default=os.environ.get("POLICYC_TOKEN"), help="bearer token (default: $POLICYC_TOKEN)")
    p.add_argument("--token-file", default=os.environ.get("POLICYC_TOKEN_FILE"), metavar="FILE",
                   help="read the bearer token from FILE (default: $POLICYC_TOKEN_FILE; without either, a service on "
                        "this machine's loopback is asked with the operator token it keeps in its state dir)")
    p.add_argument("--tls-ca", help="CA certificate to verify the server with (enables TLS)")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline per call, seconds (default 10)")
    if with_format:
        p.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")


class SetupError(OSError):
    """The connection cannot be set up: a CA or token file that cannot be read (one line;
    an OSError, as callers that catch the CA file's error expect)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.strerror = message

    def __str__(self) -> str:
        return str(self.strerror)


def token_for(args: argparse.Namespace) -> str | None:
    """The bearer token: `--token` ($POLICYC_TOKEN), else `--token-file` ($POLICYC_TOKEN_FILE),
    else, for a service on this machine's loopback, the operator token it keeps (its state
    dir or its runtime entry: `server/operator_token.py`); None: call without one."""
    from policyc.server.operator_token import TokenFileError, find_for, read_token_file

    if args.token:
        return str(args.token)
    try:
        if getattr(args, "token_file", None):
            return read_token_file(Path(args.token_file))
        found = find_for(args.server)
    except TokenFileError as e:
        raise SetupError(str(e)) from None
    return found[0] if found is not None else None


def connect(args: argparse.Namespace) -> DecisionClient:
    """The client for `args`; SetupError when the CA or token file cannot be read."""
    ca = None
    if args.tls_ca:
        try:
            with open(args.tls_ca, "rb") as f:
                ca = f.read()
        except OSError as e:
            raise SetupError(f"{args.tls_ca}: {e.strerror}") from None
    return DecisionClient(args.server, token=token_for(args), tls_ca=ca, timeout=args.timeout)


def fail(command: str, args: argparse.Namespace, e: ClientError) -> int:
    """Report a failed call; UNAVAILABLE for an unreachable service, REFUSED otherwise."""
    code = Exit.UNAVAILABLE if isinstance(e, Unavailable) else Exit.REFUSED
    if getattr(args, "format", "text") == "json":
        print(json.dumps({"ok": False, "server": args.server, "error": e.as_json()}, indent=1, sort_keys=True))
    else:
        where = f"{args.server}: " if code is Exit.UNAVAILABLE else ""
        print(f"policyc {command}: error: {where}{e.code.name}: {e.message}", file=sys.stderr)
        for p in e.problems:
            print(f"  {p}", file=sys.stderr)
    return code


def usage(command: str, message: str) -> int:
    print(f"policyc {command}: error: {message}", file=sys.stderr)
    return Exit.USAGE
