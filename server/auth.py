"""Who may call what: bearer tokens mapped to roles, checked per RPC.

Roles: `client` decides and explains; `auditor` is read-only (explain, health, reflection);
`operator` may do everything, including registration and reload. Tokens travel in the
`authorization: Bearer <token>` metadata and belong on TLS; plaintext is accepted only on
loopback (see `transport.py`). With no tokens configured every caller is an operator:
that is the loopback development mode, and the server refuses it off loopback.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping

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


GRANTS: Mapping[Role, frozenset[Permission]] = {
    Role.CLIENT: frozenset({Permission.DECIDE, Permission.EXPLAIN}),
    Role.AUDITOR: frozenset({Permission.EXPLAIN}),
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
