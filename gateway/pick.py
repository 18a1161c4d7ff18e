"""From an admitted decision to what Envoy is told: the endpoints in order (the chosen
instance, then the redirect's backup), the per-try timeout, the headers of the retry.

The budget is the guardian's: `RuleTable.budget_for(model, predicted)` — the request-scope
breakers of the bundle (`elapsed >= 92.5 % of slo`, `elapsed >= 300 % of predicted`),
lowered once per bundle by `enforcer.rule_table` — minus what the request has already
spent before Envoy sends it upstream. The redirect is that breaker's `redirect` action.
A request that is already a retry (`X-Retry-Count >= 1`) is never redirected again: it
gets no fallback and Envoy is told to make no retry.
"""

from __future__ import annotations

import math
from typing import NamedTuple
from urllib.parse import urlencode

from policyc.compiler.bundle import Breaker, Redirect
from policyc.enforcer.guardian import RETRY_HEADER
from policyc.enforcer.rule_table import RuleTable
from policyc.server.decision import Decision

from .pool import Member, Pool


class Route(NamedTuple):
    """What every pick onto one instance under one rule shares, worked out once per pool
    version (`plan_pick`'s memo): the retry's fallbacks and headers, the Endpoint Picker
    Protocol's value, and the serialized head of the picker's answer (`messages.forward_bytes`)
    by (per-try timeout, response phase, watched)."""

    fallbacks: tuple[Member, ...]
    redirect: Redirect | None
    retry_headers: tuple[tuple[str, str], ...]
    endpoints: str
    retry_headers_value: str
    heads: dict[tuple[int | None, bool, bool], bytes]
    breaker: Breaker | None
    pool: Pool


class Pick(NamedTuple):
    """One pick (a tuple: built on every request, cheaper than a frozen dataclass)."""

    decision_id: str
    model: str
    instance_id: str
    endpoint: str
    gpu_key: str
    fallbacks: tuple[Member, ...]
    per_try_timeout_ms: int | None  # None: no budget rule for this model
    breaker: Breaker | None  # the rule whose budget it is
    redirect: Redirect | None  # what the retry is (None: no retry)
    retry_headers: tuple[tuple[str, str], ...]  # set on attempts after the first
    predicted_ms: float
    retry_count: int
    route: Route | None = None  # what it shares with the picks like it (None: built by hand)

    @property
    def endpoints(self) -> str:
        """The Endpoint Picker Protocol's value: `ip:port,ip:port,...`, tried in order."""
        if self.route is not None:
            return self.route.endpoints
        return ",".join((self.endpoint, *(m.endpoint for m in self.fallbacks)))

    @property
    def retry_headers_value(self) -> str:
        if self.route is not None:
            return self.route.retry_headers_value
        return urlencode(self.retry_headers)


def _redirect_of(breaker: Breaker | None) -> Redirect | None:
    if breaker is None:
        return None
    return next((a for a in breaker.actions if isinstance(a, Redirect)), None)


ROUTES_MAX = 4096
_routes: dict[tuple[object, ...], Route] = {}


def _route(breaker: Breaker | None, retry_count: int, endpoint: str, gpu_key: str, pool: Pool,
           subset: frozenset[str] | None = None) -> Route:
    # the breaker by identity (a route holds its breaker, so the id stays its own while memoized)
    key = (id(breaker), retry_count, endpoint, gpu_key, id(pool), pool.version(), subset)
    found = _routes.get(key)
    if found is not None:
        return found
    redirect = _redirect_of(breaker) if retry_count == 0 else None
    fallbacks: tuple[Member, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    if redirect is not None:
        if subset is None:
            fallbacks = pool.fallbacks(redirect.backup, endpoint, gpu_key)
        else:  # the Endpoint Picker Protocol: fallbacks too come from the gateway's candidate subset
            fallbacks = tuple(m for m in pool.fallbacks(redirect.backup, endpoint, gpu_key, n=len(subset))
                              if m.endpoint in subset)[:1]
        hs = {k.lower(): v for k, v in redirect.headers}
        hs[RETRY_HEADER] = str(retry_count + 1)  # the guardian's rule: the retry says it is one
        headers = tuple(sorted(hs.items()))
        if not fallbacks:  # no backup with an endpoint is registered: the break ends the request
            redirect, headers = None, ()
    if len(_routes) >= ROUTES_MAX:
        _routes.clear()
    r = _routes[key] = Route(fallbacks, redirect, headers, ",".join((endpoint, *(m.endpoint for m in fallbacks))),
                             urlencode(headers), {}, breaker, pool)
    return r


def plan_pick(d: Decision, table: RuleTable, pool: Pool, spent_s: float, subset: frozenset[str] | None = None) -> Pick:
    """`d` must be admitted with a placement on an instance with an endpoint. `subset`: the
    gateway's candidate endpoints (the fallback list is drawn from them alone)."""
    plan = d.plan
    assert plan is not None and d.model is not None and d.endpoint
    predicted = plan.latency.total
    found = table.budget_for(d.model, predicted if predicted > 0 and math.isfinite(predicted) else None)
    breaker, timeout_ms = None, None
    if found is not None:
        rule, seconds = found
        breaker = rule.breaker
        timeout_ms = max(1, int((seconds - max(spent_s, 0.0)) * 1e3))
    r = _route(breaker, d.retry_count, d.endpoint, plan.gpu_key, pool, subset)
    return Pick(d.decision_id, d.model, plan.instance_id, d.endpoint, plan.gpu_key, r.fallbacks, timeout_ms, breaker,
                r.redirect, r.retry_headers, predicted * 1e3, d.retry_count, r)
