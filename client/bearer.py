"""A channel whose every call carries a bearer token, for code that uses the generated
stubs directly (`pb_grpc.DecisionsStub(with_token(channel, token))`); `DecisionClient`
takes `token=` itself."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import grpc


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, d: grpc.ClientCallDetails) -> _Details:
        md = [m for m in (d.metadata or ()) if m[0] != "authorization"]  # type: ignore[attr-defined]
        return _Details(d.method, d.timeout, [*md, self._md], d.credentials,  # type: ignore[attr-defined]
                        getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def with_token(channel: grpc.Channel, token: str | None) -> grpc.Channel:
    """`channel`, every call of which sends `authorization: Bearer <token>` (unchanged when
    `token` is None)."""
    return grpc.intercept_channel(channel, _Bearer(token)) if token else channel


def operator_channel(target: str, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A plaintext channel to a decision service on this machine's loopback that carries
    the operator token the service keeps (`server/operator_token.py`: its state dir or its
    runtime entry), as the CLI finds it; a plain channel when there is none (tests, the
    demo and benchmarks register their fleet through it)."""
    from policyc.server.operator_token import find_for

    found = find_for(target)
    return with_token(grpc.insecure_channel(target, options=options), found[0] if found is not None else None)
