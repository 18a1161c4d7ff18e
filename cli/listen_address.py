"""`--host`: the address a server listens on, checked before anything else reads it.

A listen address is an IP address (`127.0.0.1`, `::1`, `0.0.0.0`, `::`, an interface's
address; IPv6 with or without brackets) or `localhost`. A name such as `not-an-address`
is refused here, as a usage error naming the flag, rather than reaching the transport
checks: there it would be taken for a non-loopback host and refused as "plaintext on a
remote address", which sends the operator after TLS when the mistake is a typo. Names are
not resolved: a listen address looked up in DNS at start-up may differ from the one an
operator reviewed, and a lookup on a host without DNS can hang the start.
"""

from __future__ import annotations

import argparse
import ipaddress

MAX_LENGTH = 64  # longer than any IP literal with a zone


def check_listen_host(text: str) -> str:
    """`text` as a listen address (brackets removed from IPv6); ValueError naming the problem."""
    if text == "localhost":
        return text
    if len(text) > MAX_LENGTH or not text.isprintable():
        shown = text[:MAX_LENGTH].encode("unicode_escape").decode("ascii") + ("..." if len(text) > MAX_LENGTH else "")
        raise ValueError(f"`{shown}` is not an IP address")
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        hint = " (give the address alone: the port has its own flag)" if _has_port(bare) else ""
        raise ValueError(f"`{text}` is not an IP address: give one such as 127.0.0.1, ::1 or 0.0.0.0, "
                         f"or localhost{hint}") from None
    return bare


def _has_port(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return host == "localhost"


def listen_host(text: str) -> str:
    """argparse `type=` for `--host`: a usage error (exit 2) naming the flag on a bad address."""
    try:
        return check_listen_host(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
