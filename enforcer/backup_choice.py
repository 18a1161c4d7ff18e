"""Where a quarantine sends a model server's new connections: one choice, made here, for
`policyc serve` (its registry) and `policyc gateway` (its pool) alike.

A model server's quarantine target is an endpoint of the backup model that its contract's
redirect breaker names, the one the picker would retry a broken request on: another
endpoint than its own, on another GPU first, best score first (`fallbacks`). A model server
whose contract has no redirect breaker, or whose backup has no endpoint registered, has no
target (None): it is never quarantined, since there would be nowhere to send its traffic.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from policyc.compiler.bundle import Breaker, Redirect
from policyc.enforcer.rule_table import RuleTable


class Member(Protocol):
    """A registered instance with an endpoint (`gateway.pool.Member`)."""

    @property
    def model(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def gpu_key(self) -> str: ...


class PoolView(Protocol):
    """The registered instances that have an endpoint (`gateway.pool.Pool`)."""

    def members(self, model: str | None = None) -> Sequence[Member]: ...
    def fallbacks(self, model: str, avoid_endpoint: str, avoid_gpu: str, n: int = 1) -> Sequence[Member]: ...


def redirect_of(breaker: Breaker | None) -> Redirect | None:
    """The breaker's redirect action, if it has one."""
    if breaker is None:
        return None
    return next((a for a in breaker.actions if isinstance(a, Redirect)), None)


def quarantine_targets(table: RuleTable, pool: PoolView) -> list[tuple[str, str | None]]:
    """(endpoint, its quarantine target's endpoint or None) for every pool member."""
    pairs: list[tuple[str, str | None]] = []
    for m in pool.members():
        found = table.budget_for(m.model, None)
        redirect = redirect_of(found[0].breaker if found else None)
        backups = pool.fallbacks(redirect.backup, m.endpoint, m.gpu_key) if redirect is not None else ()
        pairs.append((m.endpoint, backups[0].endpoint if backups else None))
    return pairs
