"""Small gRPC servers and calls for the enforcer tests (generic handlers, bytes in and out).

The request body is a delay in milliseconds as ASCII; the reply names the server, the
variant it served and the `x-retry-count` it saw, so tests can tell who answered what.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc

METHOD = "/policyc.test.Echo/Call"


def _ident(b: bytes) -> bytes:
    return b


def start_server(name: str, host: str = "127.0.0.1", cancelled: list[str] | None = None) -> tuple[grpc.Server, int]:
    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        md = dict(context.invocation_metadata())
        delay = float(request.decode() or "0") / 1e3
        done = threading.Event()
        context.add_callback(done.set)
        end = time.monotonic() + delay
        while time.monotonic() < end and context.is_active():
            time.sleep(0.002)
        if not context.is_active():
            if cancelled is not None:
                cancelled.append(md.get("request-id", "?"))
            return b""
        return f"{name}|{md.get('x-variant', '')}|{md.get('x-retry-count', '0')}".encode()

    handler = grpc.method_handlers_generic_handler(
        "policyc.test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call, _ident, _ident)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    return server, port


def stub(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(METHOD, request_serializer=_ident, response_deserializer=_ident)
