"""Who may call what: bearer tokens mapped to roles, checked per RPC by a server interceptor.

Roles: `client` decides and explains; `auditor` is read-only (explain, list instances);
`operator` may do everything, including registration and reload. Health and reflection
are open to every caller (probes carry no token). `RoleInterceptor` checks each call
before its method runs, from the table `METHOD_PERMISSIONS`, so no method checks roles
itself and a new method without an entry is refused rather than left open. Tokens travel in the
`authorization: Bearer <token>` metadata and belong on TLS; plaintext is accepted only on
loopback (see `transport.py`). With no tokens configured every caller is an operator:
that is the loopback development mode, and the server refuses it off loopback.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Awaitable, Callable, Iterable, Mapping

import grpc

from .errors import ServiceError, Status


class Role(str, Enum):
    CLIENT = "client"
    AUDITOR = "auditor"
    OPERATOR = "operator"


class Permission(str, Enum):
    DECIDE = "decide"
    EXPLAIN = "explain"
    REGISTER = "register"
    RELOAD = "reload"
    LIST = "list"


GRANTS: Mapping[Role, frozenset[Permission]] = {
    Role.CLIENT: frozenset({Permission.DECIDE, Permission.EXPLAIN}),
    Role.AUDITOR: frozenset({Permission.EXPLAIN, Permission.LIST}),
    Role.OPERATOR: frozenset(Permission),
}


@dataclass(frozen=True)
class Tokens:
    """token → role; empty means authentication is off (loopback development only)."""

    roles: Mapping[str, Role] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.roles)

    @staticmethod
    def parse(specs: Iterable[str]) -> "Tokens":
        """From `role:token` strings (the CLI's `--token`), or ServiceError naming the bad one."""
        out: dict[str, Role] = {}
        for s in specs:
            role, sep, token = s.partition(":")
            if not sep or not token:
                raise ValueError(f"token `{s[:20]}`: expected `role:token` with role one of {', '.join(r.value for r in Role)}")
            try:
                out[token] = Role(role)
            except ValueError:
                raise ValueError(f"token role `{role}` is not one of {', '.join(r.value for r in Role)}") from None
        return Tokens(out)

    def role_of(self, metadata: Iterable[tuple[str, str | bytes]]) -> Role:
        if not self.enabled:
            return Role.OPERATOR
        header = next((v for k, v in metadata if k == "authorization"), None)
        if header is None:
            raise ServiceError(Status.UNAUTHENTICATED, "no `authorization: Bearer <token>` metadata")
        text = header.decode() if isinstance(header, bytes) else header
        scheme, _, token = text.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ServiceError(Status.UNAUTHENTICATED, "`authorization` metadata must be `Bearer <token>`")
        for known, role in self.roles.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                return role
        raise ServiceError(Status.UNAUTHENTICATED, "unknown token")

    def require(self, metadata: Iterable[tuple[str, str | bytes]], permission: Permission) -> Role:
        role = self.role_of(metadata)
        if permission not in GRANTS[role]:
            raise ServiceError(Status.PERMISSION_DENIED, f"role `{role.value}` may not {permission.value}")
        return role


DECISIONS = "/policyc.decision.v1.Decisions/"
METHOD_PERMISSIONS: Mapping[str, Permission] = {
    DECISIONS + "Decide": Permission.DECIDE,
    DECISIONS + "DecideBatch": Permission.DECIDE,
    DECISIONS + "MatchAll": Permission.LIST,
    DECISIONS + "Explain": Permission.EXPLAIN,
    DECISIONS + "RegisterInstance": Permission.REGISTER,
    DECISIONS + "DeregisterInstance": Permission.REGISTER,
    DECISIONS + "ReloadBundle": Permission.RELOAD,
    DECISIONS + "ListInstances": Permission.LIST,
}
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that answers every call with `code` (bytes in: nothing is parsed)."""

    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(refuse)


class RoleInterceptor(grpc.aio.ServerInterceptor):
    """Checks the caller's bearer token and role before a method runs.

    Installed only when tokens are configured (without tokens every caller is an
    operator, on loopback), so the development mode pays nothing. `on_refuse(method,
    status)` counts refusals (the server's error metric)."""

    def __init__(self, tokens: Tokens, on_refuse: Callable[[str, str], None] | None = None,
                 permissions: Mapping[str, Permission] = METHOD_PERMISSIONS) -> None:
        self.tokens = tokens
        self.permissions = permissions
        self.on_refuse = on_refuse

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        method = details.method
        permission = self.permissions.get(method)
        if permission is None:
            if method.startswith(OPEN_PREFIXES):
                return await continuation(details)
            return self._refuse(method, ServiceError(Status.PERMISSION_DENIED, f"method `{method}` is not open to any role"))
        try:
            self.tokens.require(details.invocation_metadata or (), permission)
        except ServiceError as e:
            return self._refuse(method, e)
        return await continuation(details)

    def _refuse(self, method: str, e: ServiceError) -> grpc.RpcMethodHandler:
        if self.on_refuse is not None:
            self.on_refuse(method.rsplit("/", 1)[-1], e.status.value)
        return _refusal(getattr(grpc.StatusCode, e.status.value), e.message)
