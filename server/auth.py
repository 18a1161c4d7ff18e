"""Who may call what: bearer tokens mapped to roles, checked per RPC before the method runs.

Roles: `client` decides and explains; `auditor` is read-only (explain, list instances);
`operator` may do everything, including registration and reload. Health and reflection
are open to every caller (probes carry no token).

A caller without a token has the **anonymous role** (`Access.anonymous`):

- `client` by default: decisions stay open, as a balancer or an application on the
  network needs them, and nothing else is (changing the fleet or the bundle, listing it);
- none (refused, UNAUTHENTICATED) once any `client:` token is configured: the roles say
  that decisions need a token too;
- `operator` only with `--open-fleet`, an explicit opt-in the service logs as a warning
  at start (loopback is no boundary on a shared host, so it is never the default).

The operator's own token is made by the service when none is given (`operator_token.py`).
`GuardedHandler` serves the Decisions service as a generic handler that checks each call
from the table `METHOD_PERMISSIONS`, before the request is even parsed, so no method
checks roles itself and a method without an entry is refused rather than left open. A
method the anonymous role may call is handed out without reading the metadata, so the
decision path pays nothing for the check. Tokens travel in the `authorization: Bearer
<token>` metadata and belong on TLS; plaintext is accepted only on loopback (see
`transport.py`).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterable, Mapping

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

_ROLES = ", ".join(r.value for r in Role)


@dataclass(frozen=True)
class Tokens:
    """token → role, as configured (`--token ROLE:TOKEN`, and the service's own operator token)."""

    roles: Mapping[str, Role] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.roles)

    def has(self, role: Role) -> bool:
        return any(r is role for r in self.roles.values())

    def with_token(self, token: str, role: Role) -> "Tokens":
        return Tokens({**self.roles, token: role})

    @staticmethod
    def parse(specs: Iterable[str]) -> "Tokens":
        """From `role:token` strings (the CLI's `--token`), or ValueError naming the bad one."""
        out: dict[str, Role] = {}
        for s in specs:
            role, sep, token = s.partition(":")
            if not sep or not token:
                raise ValueError(f"token `{s[:20]}`: expected `role:token` with role one of {_ROLES}")
            try:
                out[token] = Role(role)
            except ValueError:
                raise ValueError(f"token role `{role}` is not one of {_ROLES}") from None
        return Tokens(out)

    def role_of_token(self, text: str) -> Role:
        """The role of an `authorization` value; ServiceError (UNAUTHENTICATED) otherwise."""
        scheme, _, token = text.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ServiceError(Status.UNAUTHENTICATED, "`authorization` metadata must be `Bearer <token>`")
        given = token.strip().encode()
        found = None
        for known, role in self.roles.items():  # every token compared, in constant time each
            if hmac.compare_digest(known.encode(), given):
                found = role
        if found is None:
            raise ServiceError(Status.UNAUTHENTICATED, "unknown token")
        return found


@dataclass(frozen=True)
class Access:
    """The tokens and the role of a caller without one (None: refused)."""

    tokens: Tokens = field(default_factory=Tokens)
    anonymous: Role | None = Role.CLIENT

    @staticmethod
    def build(tokens: Tokens, *, open_fleet: bool = False) -> "Access":
        if open_fleet:
            return Access(tokens, Role.OPERATOR)
        return Access(tokens, None if tokens.has(Role.CLIENT) else Role.CLIENT)

    def open_to_anonymous(self, permission: Permission) -> bool:
        return self.anonymous is not None and permission in GRANTS[self.anonymous]

    def role_of(self, metadata: Iterable[tuple[str, str | bytes]]) -> Role:
        header = next((v for k, v in metadata if k == "authorization"), None)
        if header is None:
            if self.anonymous is None:
                raise ServiceError(Status.UNAUTHENTICATED, "no `authorization: Bearer <token>` metadata")
            return self.anonymous
        return self.tokens.role_of_token(header.decode(errors="replace") if isinstance(header, bytes) else header)

    def require(self, metadata: Iterable[tuple[str, str | bytes]], permission: Permission) -> Role:
        role = self.role_of(metadata)
        if permission not in GRANTS[role]:
            if role is self.anonymous:
                raise ServiceError(Status.UNAUTHENTICATED, f"{permission.value} needs a token: a caller without one "
                                   f"is a `{role.value}`, which may not {permission.value} (the operator token is in "
                                   "the service's state dir; `--open-fleet` opens it to anyone)")
            raise ServiceError(Status.PERMISSION_DENIED, f"role `{role.value}` may not {permission.value}")
        return role


DECISIONS = "/policyc.decision.v1.Decisions/"
METHOD_PERMISSIONS: Mapping[str, Permission] = {
    DECISIONS + "Decide": Permission.DECIDE,
    DECISIONS + "DecideBatch": Permission.DECIDE,
    DECISIONS + "MatchAll": Permission.LIST,
    DECISIONS + "Explain": Permission.EXPLAIN,
    DECISIONS + "RegisterInstance": Permission.REGISTER,
    DECISIONS + "RegisterInstances": Permission.REGISTER,
    DECISIONS + "DeregisterInstance": Permission.REGISTER,
    DECISIONS + "ReloadBundle": Permission.RELOAD,
    DECISIONS + "ListInstances": Permission.LIST,
    DECISIONS + "ListHosts": Permission.LIST,
}


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that answers every call with `code` (bytes in: nothing is parsed)."""

    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(refuse)


class GuardedHandler(grpc.GenericRpcHandler):
    """The Decisions service's methods (`name` → handler), each handed out only to a caller
    whose role has the method's permission in `permissions`. `on_refuse(method, status)`
    counts refusals (the server's error metric)."""

    def __init__(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler], access: Access,
                 on_refuse: Callable[[str, str], None] | None = None,
                 permissions: Mapping[str, Permission] = METHOD_PERMISSIONS) -> None:
        self.access = access
        self.on_refuse = on_refuse
        self._handlers = {f"/{service}/{name}": h for name, h in handlers.items()}
        self._permissions = permissions
        # the methods a caller without a token may call: handed out with no look at the metadata
        self._open = {m: h for m, h in self._handlers.items()
                      if (p := permissions.get(m)) is not None and access.open_to_anonymous(p)}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = details.method  # type: ignore[attr-defined]
        handler = self._open.get(method)
        if handler is not None:
            return handler
        handler = self._handlers.get(method)
        if handler is None:
            return None  # not this service's: UNIMPLEMENTED, as before
        permission = self._permissions.get(method)
        try:
            if permission is None:
                raise ServiceError(Status.PERMISSION_DENIED, f"method `{method}` is not open to any role")
            self.access.require(details.invocation_metadata or (), permission)  # type: ignore[attr-defined]
        except ServiceError as e:
            if self.on_refuse is not None:
                self.on_refuse(method.rsplit("/", 1)[-1], e.status.value)
            return _refusal(getattr(grpc.StatusCode, e.status.value), e.message)
        return handler
