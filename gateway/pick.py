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
from dataclasses import dataclass
from urllib.parse import urlencode

from policyc.compiler.bundle import Breaker, Redirect
from policyc.enforcer.guardian import RETRY_HEADER
from policyc.enforcer.rule_table import RuleTable
from policyc.server.decision import Decision

from .pool import Member, Pool


@dataclass(frozen=True, slots=True)
class Pick:
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

    @property
    def endpoints(self) -> str:
        """The Endpoint Picker Protocol's value: `ip:port,ip:port,...`, tried in order."""
        return ",".join((self.endpoint, *(m.endpoint for m in self.fallbacks)))

    @property
    def retry_headers_value(self) -> str:
        return urlencode(self.retry_headers)


def _redirect_of(breaker: Breaker | None) -> Redirect | None:
    if breaker is None:
        return None
    return next((a for a in breaker.actions if isinstance(a, Redirect)), None)


def plan_pick(d: Decision, table: RuleTable, pool: Pool, spent_s: float) -> Pick:
    """`d` must be admitted with a placement on an instance with an endpoint."""
    plan = d.plan
    assert plan is not None and d.model is not None and d.endpoint
    predicted = plan.latency.total
    found = table.budget_for(d.model, predicted if predicted > 0 and math.isfinite(predicted) else None)
    breaker, timeout_ms = None, None
    if found is not None:
        rule, seconds = found
        breaker = rule.breaker
        timeout_ms = max(1, int((seconds - max(spent_s, 0.0)) * 1e3))
    redirect = _redirect_of(breaker) if d.retry_count == 0 else None
    fallbacks: tuple[Member, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    if redirect is not None:
        fallbacks = pool.fallbacks(redirect.backup, d.endpoint, plan.gpu_key)
        hs = {k.lower(): v for k, v in redirect.headers}
        hs[RETRY_HEADER] = str(d.retry_count + 1)  # the guardian's rule: the retry says it is one
        headers = tuple(sorted(hs.items()))
        if not fallbacks:  # no backup with an endpoint is registered: the break ends the request
            redirect, headers = None, ()
    return Pick(d.decision_id, d.model, plan.instance_id, d.endpoint, plan.gpu_key, fallbacks, timeout_ms, breaker,
                redirect, headers, predicted * 1e3, d.retry_count)
