"""Bases built ahead of their requests (`matcher/base_catalog.py`, `FleetIndex.prebuild`)
answer as the naive scan does, and cover what the fleet's requests can ask.

- After a registry's prebuild, requests of every kind, with flags sent as `no` or not at
  all, other tenants, unknown families and every ordering of the latency rule, equal the
  naive scan; so do they after adds, removes and score moves make the prebuilt bases (and
  their compact ranks) stale, and after a bundle swap prebuilds again.
- The listing covers the request mix: once warm, no request of the benchmark's four kinds
  makes a base or builds ranks (every one is answered by prebuilt ranks).
- Requests that differ only where no requirement reads (a flag sent as `no` or left out)
  share one base; compact ranks read as the full arrays do at every cut.
"""

from __future__ import annotations

import gc
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from policyc.matcher import Registry
from policyc.matcher.base_catalog import domains, reachable
from policyc.matcher.threshold_ranks import ThresholdRanks, best_at

from fleet_shapes import KINDS, REGIONS, make_fleet, request_headers
from test_fleet_scale import churn, naive_order, small_thresholds  # noqa: F401  (a fixture)


def _headers(rng: random.Random, families: int) -> dict[str, str]:
    """One of the four kinds, or a variation the mix never sends: a flag as `no`, the
    finance tenant, a family no instance has."""
    h = request_headers(rng.choice(KINDS), rng, families)
    r = rng.random()
    if r < 0.2:
        h[rng.choice(("X-Require-TPM", "X-Require-Encryption", "X-Require-Firewall"))] = "no"
    elif r < 0.35:
        h["X-Tenant"] = "acme-bank"
    elif r < 0.45:
        h["X-Model"] = "model-99"
    return h


def _agrees(reg: Registry, h: dict[str, str]) -> None:
    q = reg.parse_request(h)
    order, ids, _ = naive_order(reg, dict(q.vars), 3)
    for _ in range(2):  # the second time from the answer cache
        got = reg.match(q, 1)
        assert got.count == len(ids) and tuple(s.instance.id for s in got.best) == order[:1], h
    got = reg.match(q, 3)
    assert got.count == len(ids) and tuple(s.instance.id for s in got.best) == order[:3], h


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), n=st.integers(1, 250), cmp=st.sampled_from(("<", "<=", ">", ">=")),
       levels=st.sampled_from((0, 2)), steps=st.integers(1, 10))
def test_prebuilt_bases_equal_naive_scan(small_thresholds: None, seed: int, n: int, cmp: str, levels: int,  # noqa: F811
                                         steps: int) -> None:
    fleet = make_fleet(n, seed, families=3, score_levels=levels, latency_cmp=cmp)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores, shard_size=8)
    assert reg.warm(30) and reg.prebuilt.done and reg.prebuilt.listed > 0
    rng = random.Random(seed)
    gone = []
    for _step in range(steps):
        for _ in range(3):
            _agrees(reg, _headers(rng, 3))
        churn(reg, rng, gone)
    assert reg.index.rank_misses == 0
    reg.swap_bundle(fleet.bundle)  # a new index: prebuilt again
    assert reg.warm(30) and reg.prebuilt.done
    for _ in range(3):
        _agrees(reg, _headers(rng, 3))
    assert reg.index.rank_misses == 0


def test_prebuilt_bases_cover_the_request_mix() -> None:
    """Every base the benchmark's request kinds produce is listed and built: once warm, a
    mix of new requests makes no base and builds no ranks."""
    families = 5
    fleet = make_fleet(3_000, 21, families=families)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores)
    assert reg.warm(60) and reg.prebuilt.done
    ix = reg.index
    listed = reg.prebuilt.listed
    # every region x family x architecture x flag combination the mix can send, and more
    assert listed >= len(REGIONS) * families and len(ix.effective) == listed
    made, stats = len(ix.effective), ix.rank_stats
    rng = random.Random(22)
    for i in range(400):
        q = reg.parse_request(request_headers(KINDS[i % 4], rng, families))
        m = reg.match(q, 1)
        if i % 40 == 0:
            order, ids, _ = naive_order(reg, dict(q.vars), 1)
            assert m.count == len(ids) and tuple(s.instance.id for s in m.best) == order[:1]
    assert len(ix.effective) == made  # no base made by a request
    assert stats.builds == 0 and stats.by_bitmap == 0 and stats.by_ranks > 300  # the rest: empty bases


def test_requests_differing_where_nothing_reads_share_a_base() -> None:
    """A flag sent as `no` applies no rule, as a flag not sent: both requests get the one
    base, made once; the finance tenant (a rule of its own) gets another."""
    fleet = make_fleet(1_200, 23)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores, prebuild=False)
    ix = reg.index
    base = {"X-SLO-Latency": "210.5ms", "X-Data-Region": "eu-west", "X-GPU-Arch": "hopper"}
    for extra in ({}, {"X-Require-TPM": "no"}, {"X-Require-Firewall": "no", "X-Require-TPM": "no"}):
        q = reg.parse_request({**base, **extra})
        order, ids, _ = naive_order(reg, dict(q.vars), 1)
        got = reg.match(q, 1)
        assert got.count == len(ids) and tuple(s.instance.id for s in got.best) == order[:1], extra
    assert len(ix.bases) == 3 and len(ix.effective) == 1
    reg.match(reg.parse_request({**base, "X-Tenant": "acme-bank"}), 1)
    assert len(ix.effective) == 2


def test_the_listing_reads_the_declared_domains() -> None:
    """Regions and architectures from the headers' `values:`, flags as yes / no / absent,
    families from the fleet (a name with no declared values, compared by `==`), the
    tenants' classes; a base per distinct (rules, values their requirements read)."""
    fleet = make_fleet(600, 24, families=2)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores, prebuild=False)
    ix = reg.index
    doms = domains(ix)
    assert doms is not None
    assert [x for x in doms["region"] if isinstance(x, str)] == list(REGIONS)
    assert sorted(x for x in doms["family"] if isinstance(x, str)) == sorted({i.model.rsplit("-", 1)[0] for i in fleet.instances})
    assert [x for x in doms["need_tpm"] if isinstance(x, bool)] == [True, False]
    assert [x for x in doms["tenant_class"] if isinstance(x, str)] == ["finance", "public"]
    listed = list(reachable(ix, doms, 10**6))
    keys = set()
    for v in listed:
        b = ix._make_base(v)
        keys.add(id(b))
    assert len(keys) == len(listed)  # one base each: no two listed requests answer alike
    # 2 rule sets per flag combination (finance or not) x 8 flag combinations, each with
    # (1 + families) x (1 + regions) x (1 + architectures) value choices
    fams = len([x for x in doms["family"] if isinstance(x, str)])
    assert len(listed) == 2 * 8 * (1 + fams) * (1 + len(REGIONS)) * (1 + 4)
    assert len(list(reachable(ix, doms, 100))) == 100


@pytest.mark.parametrize("cmp", ("<", "<=", ">", ">="))
def test_compact_ranks_answer_as_the_full_arrays(cmp: str) -> None:
    """At every cut (each distinct value, and between them), compact ranks give the count
    and best candidate the full arrays give, for members of every size."""
    fleet = make_fleet(900, 25, score_levels=3, latency_cmp=cmp)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores, prebuild=False)
    ix, tiers = reg.index, reg._tiers
    attr = ix.attr_index["slo_latency"]
    keys = attr.keys
    probes = list(keys) + [(a + b) / 2 for a, b in zip(keys, keys[1:])] + [keys[0] - 1, keys[-1] + 1]
    rng = random.Random(26)
    below = cmp in ("<", "<=")
    for size in (1, 2, 7, 60, 900):
        members = BitMap(rng.sample(sorted(ix.live), min(size, len(ix.live))))
        full = ThresholdRanks(members, attr, below, tiers, ix.version)
        compact = ThresholdRanks(members, attr, below, tiers, ix.version, compact=True)
        assert full.counts is not None and compact.counts is None and compact.cuts is not None
        assert len(compact.cuts) <= len(members)
        for x in probes:
            got = best_at(compact, attr, cmp, x, tiers)  # type: ignore[arg-type]
            assert got == best_at(full, attr, cmp, x, tiers), (size, x)  # type: ignore[arg-type]
            n = sum(1 for s in members if _holds(ix.attrs[s]["slo_latency"], cmp, x))  # type: ignore[arg-type]
            assert got[0] == n and (got[1] is None) == (n == 0), (size, x)


def _holds(v: float, cmp: str, x: float) -> bool:
    return {"<": v < x, "<=": v <= x, ">": v > x, ">=": v >= x}[cmp]


def test_a_dropped_registry_stops_its_prebuild() -> None:
    """A reload drops the old state's registry: its prebuild stops at the next chunk rather
    than building bases nobody will read (the thread holds no reference to the registry)."""
    fleet = make_fleet(2_000, 27)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores)
    thread, stats = reg._prebuilder, reg.prebuilt
    assert thread is not None
    del reg
    gc.collect()
    thread.join(10)
    assert not thread.is_alive() and not stats.done and stats.built < 36_720


def test_the_decision_service_state_prebuilds() -> None:
    """The state a decision server builds at start and at every reload (`server/state.py`)
    gets its bases prebuilt: a new request's base is ready, no ranks built for it."""
    from policyc.server.state import build_state

    fleet = make_fleet(1_500, 28, families=4)
    state = build_state(fleet.bundle, fleet.instances, fleet.scores)
    reg = state.registry
    assert reg.warm(30) and reg.prebuilt.done and reg.prebuilt.built == reg.prebuilt.listed > 0
    rng = random.Random(29)
    for kind in KINDS:
        q = reg.parse_request(request_headers(kind, rng, 4))
        order, ids, _ = naive_order(reg, dict(q.vars), 1)
        got = reg.match(q, 1)
        assert got.count == len(ids) and tuple(s.instance.id for s in got.best) == order[:1], kind
    assert reg.index.rank_stats.builds == 0 and reg.index.rank_stats.by_bitmap == 0
