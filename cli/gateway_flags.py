"""`policyc gateway`'s bounds on what one client may hold (`gateway/limits.py` says what
each one sets in Envoy and what a client sees beyond it), as flags, and the `Limits` they make."""

from __future__ import annotations

import argparse
from typing import Any

from policyc.gateway.limits import Limits

_D = Limits()

# (flag, Limits field, type, help)
FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--request-headers-timeout", "request_headers_timeout_s", float,
     f"seconds a request's headers may take to arrive; a slower client's connection is closed (default {_D.request_headers_timeout_s:g})"),
    ("--idle-timeout", "idle_timeout_s", float,
     f"seconds a client connection with no request lives (default {_D.idle_timeout_s:g})"),
    ("--stream-idle-timeout", "stream_idle_timeout_s", float,
     f"seconds a request may pass with no bytes either way (default {_D.stream_idle_timeout_s:g})"),
    ("--max-connections", "max_connections", int,
     f"client connections at once; beyond, new ones are closed at once (default {_D.max_connections})"),
    ("--max-concurrent-streams", "max_concurrent_streams", int,
     f"streams at once on one HTTP/2 client connection (default {_D.max_concurrent_streams})"),
    ("--connection-buffer-bytes", "connection_buffer_bytes", int,
     f"bytes Envoy buffers per client connection before flow control holds it back (default {_D.connection_buffer_bytes})"),
    ("--max-request-headers-kb", "max_request_headers_kb", int,
     f"KiB of request headers; beyond, 431 with x-policyc-reason over HTTP/1.1 and HTTP/2 (default {_D.max_request_headers_kb})"),
    ("--max-headers-count", "max_headers_count", int,
     f"request headers (Envoy's own included); beyond, 431 with x-policyc-reason (default {_D.max_headers_count})"),
    ("--max-pending-picks", "max_pending_picks", int,
     (f"requests waiting for the endpoint picker; beyond, 429 with x-policyc-reason at once, before the picker's "
      f"timeout could answer 503 (default {_D.max_pending_picks}; keep it under what the picker decides in 0.2 s)")),
    ("--max-heap-mb", "max_heap_mb", int,
     f"Envoy's heap: at 90 %% it is shrunk, at 98 %% new requests get 503 with x-policyc-reason (default {_D.max_heap_mb})"),
)


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("client bounds (bursts, slow clients, large headers)")
    for flag, field, kind, help_ in FLAGS:
        g.add_argument(flag, dest=field, type=kind, default=getattr(_D, field), metavar="N", help=help_)


def limits_from(args: Any) -> Limits:
    """The flags' `Limits`; ValueError naming the flag out of range."""
    limits = Limits(**{field: getattr(args, field) for _, field, _, _ in FLAGS})
    try:
        limits.check()
    except ValueError as e:
        name = str(e).split(" ", 1)[0]
        flag = next((f for f, field, _, _ in FLAGS if field.replace("_", "-") == name), name)
        raise ValueError(f"{flag}{str(e)[len(name):]}") from None
    return limits
