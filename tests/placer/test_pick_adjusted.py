"""The picker's request-stage adjustment (`Picker._adjusted`: this gateway's requests in flight,
the predicted TTFT, the prefix-affinity credit, the TTFT SLO) is vectorised over the feasible
candidates by GPU row; here it is held equal, on random candidates, counters, prefixes,
readings and requests, to the same rules stated GPU key by GPU key (the picker's loop before
it was vectorised, on the signals' key-by-key reads): the same choice, the same adjusted
ranks, the same plan line."""

from __future__ import annotations

from typing import Mapping

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from placer_support import contract

from policyc.compiler.bundle import Contract, GpuClass, Llm
from policyc.placer import SimulatedCluster
from policyc.placer.catalog import DEFAULT_CATALOG
from policyc.placer.evaluate import Evaluation
from policyc.placer.evaluated import Evaluated, RowFixed
from policyc.placer.pick import IN_FLIGHT, LATE, PREDICTED, PREFIX, Picker
from policyc.placer.readings import Reading, Readings
from policyc.placer.request_facts import RequestFacts
from policyc.placer.signals.gateway_in_flight import InFlightCounts
from policyc.placer.signals.prefix_affinity import PrefixIndex
from policyc.placer.sites import Sites
from policyc.placer.snapshot import Snapshot
from policyc.placer.topology import Topology

SIM = SimulatedCluster(seed=7, hosts=4, gpus_per_host=4, hosts_per_rack=2)
T: Topology = SIM.topology()
CATALOG = {g.name: g for g in DEFAULT_CATALOG}
N = len(T.gpus)


def _llm_contract(prefill_s_per_token_h100: float) -> Contract:
    base = contract()
    llm = Llm(prefill_flops=prefill_s_per_token_h100 * base.compute.efficiency * 989e12, decode_flops=1e6, context=8192)
    return base.model_copy(update={"llm": llm})


CONTRACT = _llm_contract(50e-6)


class _Candidates(Evaluated):
    """Candidates as the choice reads them (GPU, refusal code, rank); nothing else is read here."""

    __slots__ = ()

    def row(self, r: int, snap: Snapshot, sites: Sites) -> tuple[RowFixed, float, float]:
        raise AssertionError("the adjustment reads no candidate's figures")

    def evaluation(self) -> Evaluation:
        raise AssertionError("the adjustment reads no whole evaluation")


def reference(p: Picker, t: Topology, ev: Evaluated, best: int, c: Contract, facts: RequestFacts | None,
              readings: Readings, catalog: Mapping[str, GpuClass]) -> tuple[int, dict[int, float], str | None]:
    """The adjustment's rules, GPU key by GPU key (the signals' key-based reads)."""
    feas = ev.feasible
    gpus = [t.gpu_keys[int(ev.gpus[r])] for r in feas]
    rank = np.array([float(ev.rank[r]) for r in feas])
    adj = rank.copy()
    counts = secs = added = np.zeros(len(feas))
    lines: list[str] = []
    if p.in_flight.busy():
        counts, secs = p.in_flight.gather(gpus)
        if facts is not None:  # an LLM request's: pooled by GPU class
            _, model_idx = t.gpu_models
            secs = np.array(IN_FLIGHT.pooled_reference(list(secs), [int(model_idx[int(ev.gpus[r])]) for r in feas]))
        added = IN_FLIGHT.added(counts, secs, rank)
        adj += added
    ttft = None
    n_late = 0
    if facts is not None:
        per = PREDICTED.per_token(c, catalog)
        names, model_idx = t.gpu_models
        prefill = facts.prompt_tokens * np.array([per.get(names[model_idx[int(ev.gpus[r])]], 0.0) for r in feas])
        waiting = PREDICTED.waiting(readings, gpus)
        ttft = PREDICTED.added(prefill, waiting)
        if facts.prefix:
            matched = p.prefixes.matched(facts.prefix, gpus)
            if matched.any():
                credit = PREFIX.credit(matched, len(facts.prefix), prefill, PREFIX.saturated(readings, gpus, counts))
                ttft = ttft - credit
                k = int(np.argmax(credit))
                if credit[k] > 0:
                    lines.append(PREFIX.note(gpus[k], float(matched[k]), len(facts.prefix), float(credit[k])))
        over = [p.in_flight.overhead(g) for g in gpus]
        classes = [int(model_idx[int(ev.gpus[r])]) for r in feas]
        pooled = IN_FLIGHT.pooled_reference([float("nan") if o is None else o for o in over], classes)
        overhead = np.array([o if o == o and o > 0 else 0.0 for o in pooled])
        ttft = ttft + overhead
        adj += ttft
        if facts.ttft_s is not None:
            prefilling = np.array([float(p.in_flight.prefilling(g)) for g in gpus])
            expected = ttft + prefill * np.maximum(prefilling - waiting, 0.0)
            late = PREDICTED.late(expected, facts.ttft_s)
            n_late = int(late.sum())
            tier = PREDICTED.tier(prefill, expected, facts.ttft_s)
            if tier is not None:
                adj = np.where(tier, adj, adj + LATE)
                lines.append(PREDICTED.tier_note(int(tier.sum()), facts.ttft_s))
            elif 0 < n_late < len(feas):
                adj = np.where(late, adj + LATE, adj)
    i = int(np.argmin(adj))
    new = feas[i]
    by_row = dict(zip(feas, adj.tolist()))
    if ttft is not None and facts is not None:
        lines.append(PREDICTED.note(gpus[i], float(ttft[i]), facts.ttft_s, n_late if 0 < n_late < len(feas) else 0,
                                    n_late < len(feas), float(overhead[i])))
    if new != best:
        j = feas.index(best)
        if counts[j] or counts[i]:
            lines.append(IN_FLIGHT.note(gpus[j], float(counts[j]), float(secs[j]), float(added[j])) +
                         f"; chose {gpus[i]} ({float(counts[i]):g} in flight)")
        else:
            lines.append(f"chose {gpus[i]} over the model's best {gpus[j]}")
    return new, by_row, "; ".join(lines) or None


_rank = st.sampled_from([0.01, 0.02, 0.05, float("inf"), float("nan")]) | st.floats(min_value=0.0, max_value=0.5)
_candidate = st.tuples(st.integers(0, N - 1), st.booleans(), _rank)  # GPU row, refused, rank
# GPUs below are named by candidate (an index, taken modulo the candidates; -1: a key not in the topology)
_gpu = st.integers(-1, 40)
# duration, or still open; the contract's TTFT at the pick and the measured first token (or none)
_begun = st.tuples(_gpu, st.sampled_from([None, None, 0.05, 0.4, 2.0]),
                   st.none() | st.tuples(st.sampled_from([0.0, 0.01, 0.2]), st.sampled_from([0.005, 0.06, 0.5])))
_reading = st.tuples(_gpu, st.sampled_from([0.0, 1.0, 3.0, float("inf"), -1.0]),
                     st.sampled_from([None, 0.1, 0.9]), st.sampled_from([0.05, 0.05, 5.0]))  # waiting, KV, age
PROMPTS = ((1, 2, 3), (1, 2, 4, 5), (6, 7), (1,), (1, 2, 3, 8, 9, 10))  # blocks: some share leading ones


@settings(max_examples=500, deadline=None)
@given(cands=st.lists(_candidate, min_size=1, max_size=40), as_array=st.booleans(), begun=st.lists(_begun, max_size=14),
       served=st.lists(st.tuples(st.sampled_from(PROMPTS), _gpu), max_size=8),
       readings=st.lists(_reading, max_size=20), facts=st.none() | st.tuples(
           st.sampled_from(PROMPTS + ((), (1, 2, 3, 7))), st.sampled_from([0.0, 100.0, 1000.0, 4000.0]),
           st.none() | st.sampled_from([0.02, 0.1, 0.3, 2.0])),
       headroom=st.sampled_from([0.0, 0.0, 0.8]))
def test_the_vectorised_adjustment_equals_its_key_by_key_reference(
        cands: list[tuple[int, bool, float]], as_array: bool,
        begun: list[tuple[int, float | None, tuple[float, float] | None]],
        served: list[tuple[tuple[int, ...], int]], readings: list[tuple[int, float, float | None, float]],
        facts: tuple[tuple[int, ...], float, float | None] | None, headroom: float) -> None:
    if all(refused for _, refused, _ in cands):
        cands[0] = (cands[0][0], False, cands[0][2])
    rows = [g for g, _, _ in cands]

    def key(c: int) -> str:
        return "elsewhere/gpu0" if c < 0 else T.gpu_keys[rows[c % len(rows)]]

    ev = _Candidates(np.array(rows, dtype=np.int64) if as_array else rows, [0 if f else -1 for _, f, _ in cands],
                     [r for _, _, r in cands])
    p = Picker()
    now = [0.0]
    p.in_flight = InFlightCounts(clock=lambda: now[0])
    for i, (g, took, first) in enumerate(begun):
        p.in_flight.begin(f"d{i}", key(g), None if first is None else first[0])
        if first is not None:
            p.in_flight.first_token(f"d{i}", first[1])
        if took is not None:
            now[0] += took
            p.in_flight.end(f"d{i}")
    for j in range(9 if begun and begun[0][1] is None else 0):  # enough in flight on one GPU to saturate it
        p.in_flight.begin(f"s{j}", key(begun[0][0]))
    for blocks, g in served:
        p.prefixes.record(blocks, key(g))
    measured = {key(g): Reading({k: v for k, v in (("queue_depth", w), ("kv_cache_usage", kv)) if v is not None}, age)
                for g, w, kv, age in readings}
    rf = None if facts is None else RequestFacts(facts[0], facts[1], facts[2])
    was = PREDICTED.headroom
    PREDICTED.headroom = headroom
    try:
        for _ in range(2):  # twice: the second reads the arrays bound on the first
            with np.errstate(invalid="ignore"):  # none in flight times an infinite rank: NaN, in both
                want = reference(p, T, ev, ev.best, CONTRACT, rf, measured, CATALOG)
                new, ranks, note = p._adjusted(T, ev, ev.best, CONTRACT, rf, measured, CATALOG)
            # the gateway's path writes its line when read (`Moved`): the same words as the rules'
            assert (new, None if note is None else str(note)) == (want[0], want[2])
            assert list(ranks.as_dict()) == list(want[1]) == ev.feasible
            np.testing.assert_array_equal([ranks[r] for r in ev.feasible], list(want[1].values()))  # NaN equals NaN here
            p.in_flight.begin("later", key(0))  # a pick forwarded between the two: the arrays follow
    finally:
        PREDICTED.headroom = was


def test_the_in_flight_arrays_follow_the_counts_and_a_new_topology() -> None:
    now = [0.0]
    c = InFlightCounts(clock=lambda: now[0], max_age_s=10.0)
    index = {k: i for i, k in enumerate(T.gpu_keys)}
    at = np.arange(N)
    c.begin("a", T.gpu_keys[1])
    c.begin("b", T.gpu_keys[1])
    counts, secs = c.gather_rows(T, index, N, at)
    assert counts[1] == 2 and counts.sum() == 2 and np.isnan(secs).all()  # nothing ended anywhere yet
    now[0] = 0.5
    c.end("a")
    c.begin("c", T.gpu_keys[2])
    counts, secs = c.gather_rows(T, index, N, at)
    assert counts.tolist() == c.gather(T.gpu_keys)[0].tolist() and secs[1] == 0.5 and (secs == 0.5).all()
    now[0] = 20.0  # past max_age_s: the open requests are forgotten, in the arrays too
    counts, _ = c.gather_rows(T, index, N, at)
    assert not counts.any() and c.forgotten == 2
    other = SimulatedCluster(seed=8, hosts=2, gpus_per_host=4).topology()  # another topology: rebuilt from the counts
    c.begin("d", other.gpu_keys[3])
    counts, _ = c.gather_rows(other, {k: i for i, k in enumerate(other.gpu_keys)}, len(other.gpus), np.arange(len(other.gpus)))
    assert counts.tolist() == c.gather(other.gpu_keys)[0].tolist() and counts[3] >= 1


def test_a_request_prefills_until_its_first_token_its_end_or_its_expiry() -> None:
    """The prefilling count (an LLM request without its first token yet) falls once, whichever
    comes first: the first token, the end, the request forgotten; by key and by row alike."""
    now = [0.0]
    c = InFlightCounts(clock=lambda: now[0], max_age_s=10.0)
    index = {k: i for i, k in enumerate(T.gpu_keys)}
    g = T.gpu_keys[3]
    at = np.array([3])

    def rows() -> tuple[float, float]:
        over, prefilling = c.first_token_rows(T, index, N, at)  # None: none anywhere
        return (float("nan") if over is None else float(over[0])), (0.0 if prefilling is None else float(prefilling[0]))

    c.begin("unary", g)  # no prediction: not an LLM request, never prefilling
    c.begin("a", g, 0.05)  # not idle (the unary call is there): prefilling, not learned from
    c.begin("b", g, 0.05)
    c.begin("c", g, 0.05)
    assert c.prefilling(g) == 3 and np.isnan(rows()[0]) and rows()[1] == 3
    assert c.first_token("a", 0.2) is None and c.prefilling(g) == 2  # its first token: decoding now
    c.first_token("a", 0.2)
    c.end("a")
    assert c.prefilling(g) == 2 and rows()[1] == 2  # once
    c.end("b")  # ended without a first token (cut, reset)
    assert c.prefilling(g) == 1 and rows()[1] == 1
    now[0] = 20.0  # "c" forgotten
    assert rows()[1] == 0 and c.prefilling(g) == 0 and c.count(g) == 0
    c.begin("d", g, 0.05)  # idle now: learned from at its first token
    assert c.first_token("d", 0.3) == 0.25 and rows() == (0.25, 0.0)


def test_the_per_token_array_follows_the_class_names() -> None:
    names, _ = T.gpu_models
    per = PREDICTED.per_token(CONTRACT, CATALOG)
    arr = PREDICTED.per_token_by_model(CONTRACT, CATALOG, names)
    assert arr.tolist() == [per.get(n, 0.0) for n in names] and arr is PREDICTED.per_token_by_model(CONTRACT, CATALOG, names)
    assert PREDICTED.per_token_by_model(contract(), CATALOG, names).tolist() == [0.0] * len(names)  # no `llm` block


class _NaiveIndex:
    """The prefix index's rules stated plainly: every record re-inserts each block, most recent GPU first."""

    def __init__(self, max_blocks: int, per_block: int) -> None:
        self.max_blocks, self.per_block = max_blocks, per_block
        self.d: dict[int, tuple[str, ...]] = {}

    def record(self, blocks: tuple[int, ...], gpu: str) -> None:
        for h in blocks:
            had = self.d.pop(h, ())
            self.d[h] = (gpu, *(g for g in had if g != gpu))[:self.per_block]
        while len(self.d) > self.max_blocks:
            del self.d[next(iter(self.d))]

    def matched(self, blocks: tuple[int, ...], gpus: list[str]) -> list[float]:
        def depth(g: str) -> int:
            n = 0
            while n < len(blocks) and g in self.d.get(blocks[n], ()):
                n += 1
            return n
        return [float(depth(g)) for g in gpus]


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.tuples(st.sampled_from(PROMPTS), st.integers(0, 5)), max_size=30),
       asked=st.sampled_from(PROMPTS + ((), (1, 2, 3, 7))), max_blocks=st.integers(1, 12), per_block=st.integers(1, 3))
def test_the_prefix_index_equals_its_plain_statement(records: list[tuple[tuple[int, ...], int]], asked: tuple[int, ...],
                                                     max_blocks: int, per_block: int) -> None:
    ix, naive = PrefixIndex(max_blocks=max_blocks, per_block=per_block), _NaiveIndex(max_blocks, per_block)
    gpus = [f"h/gpu{i}" for i in range(6)]
    for blocks, g in records:
        ix.record(blocks, gpus[g])
        naive.record(blocks, gpus[g])
        assert ix.matched(asked, gpus).tolist() == naive.matched(asked, gpus)
    assert len(ix) == len(naive.d)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.05, 0.4, 2.0, 1e-9, float("nan")]) | st.floats(0.0, 10.0),
                          st.integers(0, 3)), min_size=1, max_size=40))
def test_pooled_seconds_equal_their_plain_statement(pairs: list[tuple[float, int]]) -> None:
    """Each candidate's seconds pooled over its GPU class: the vectorised form (`_adjusted`'s) and
    the plain statement (the reference's) agree to the bit, NaN where its class has no figure."""
    secs, classes = [s for s, _ in pairs], [c for _, c in pairs]
    fast = IN_FLIGHT.pooled(np.array(secs), np.array(classes, dtype=np.int64)).tolist()
    plain = IN_FLIGHT.pooled_reference(secs, classes)
    assert [x if x == x else "nan" for x in fast] == [x if x == x else "nan" for x in plain]
    for c in set(classes):
        own = [s for s, k in pairs if k == c and s == s]
        got = {p for p, k in zip(plain, classes) if k == c}
        assert len(got) == 1 and (next(iter(got)) == sum(own) / len(own) if own else next(iter(got)) != next(iter(got)))
