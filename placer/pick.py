"""The picker: which feasible candidate a request gets, once the signals have filtered and
ranked them (the Inference Extension's "pick" after its filters and scorers).

The best rank wins, once each feasible candidate's rank has the request-stage signals'
seconds added: this gateway's requests in flight there (`signals/gateway_in_flight.py`:
counted at every pick, not once per tick, so a burst inside one tick spreads instead of
herding onto one GPU), and for an LLM request picked on its body (`request_facts.CURRENT`)
this prompt's predicted time to first token on the candidate's GPU class at its measured
queue (`signals/predicted_ttft.py`) less the prefill its server likely holds cached
(`signals/prefix_affinity.py`: sticky until saturated). A request with its own TTFT SLO goes
to a candidate predicted within it when one is feasible. Then two pieces of state between
requests may keep another:
- sticky choices per affinity key (hysteresis: the previous GPU stays while it is feasible
  and within a margin of the best, so placements do not flap between ticks);
- sessions: a session stays on its GPU (next to its state store) until that placement
  becomes infeasible; a move prefers the same NUMA node, then the same host, and is
  reported in the plan.

The picker holds no lock of its own: the placer calls it under the lock that also guards
the shares reserved this tick, so a choice and its reservation are one step.
"""

from __future__ import annotations

from typing import Mapping, Sequence, cast

import numpy as np

from policyc.compiler.bundle import Contract, GpuClass

from .evaluate import Evaluation
from .evaluated import Evaluated
from .plan import SessionMove
from .readings import NO_READINGS, Reading, Readings
from .request_facts import CURRENT, RequestFacts
from .signals import REGISTRY
from .signals.gateway_in_flight import GatewayInFlight, InFlightCounts
from .signals.predicted_ttft import PredictedTtft
from .signals.prefix_affinity import PrefixAffinity, PrefixIndex
from .topology import Topology


IN_FLIGHT = cast(GatewayInFlight, REGISTRY["gateway_in_flight"])
PREFIX = cast(PrefixAffinity, REGISTRY["prefix_affinity"])
PREDICTED = cast(PredictedTtft, REGISTRY["predicted_ttft"])
SCALAR_MAX = 16  # feasible candidates up to which a pick without request facts is adjusted in plain Python
INF = float("inf")
LATE = 1e3  # seconds added to a candidate predicted past the request's TTFT SLO (one within it wins)


class Note:
    """A plan's line about the pick, written when the plan's reasons are read (most never
    are: `Explanation` is lazy): `str()` gives the sentence."""

    __slots__ = ()


class Moved(Note):
    """The line of a pick the in-flight counts moved off the model's best candidate (the
    gateway's gRPC path, `Picker._in_flight_only`), formatted only when read."""

    __slots__ = ("_chose", "_best", "_count_best", "_secs_best", "_added_best", "_count_chose")

    def __init__(self, chose: str, best: str, count_best: float, secs_best: float, added_best: float,
                 count_chose: float) -> None:
        self._chose, self._best = chose, best
        self._count_best, self._secs_best, self._added_best, self._count_chose = count_best, secs_best, added_best, count_chose

    def __str__(self) -> str:
        if self._count_best or self._count_chose:
            return (IN_FLIGHT.note(self._best, self._count_best, self._secs_best, self._added_best) +
                    f"; chose {self._chose} ({self._count_chose:g} in flight)")
        return f"chose {self._chose} over the model's best {self._best}"


class Kept(Note):
    """The hysteresis note of a plan (`kept host/gpuN ...`), written when the plan's reasons
    are read (most never are): `str()` gives the sentence."""

    __slots__ = ("_t", "_prev", "_best", "_hyst", "_abs")

    def __init__(self, t: Topology, prev: int, best: int, hyst: float, hyst_abs: float) -> None:
        self._t, self._prev, self._best, self._hyst, self._abs = t, prev, best, hyst, hyst_abs

    def __str__(self) -> str:
        t = self._t
        return (f"kept {t.gpu_key(self._prev)} (hysteresis: within {self._hyst:.0%} + "
                f"{self._abs * 1e3:g} ms of the best, {t.gpu_key(self._best)})")


class Adjusted:
    """The feasible rows' adjusted ranks, read by row (`adjusted[r]`); made for every adjusted
    pick, read only when a sticky choice is weighed, so nothing is copied until then."""

    __slots__ = ("rows", "ranks", "ttft")

    def __init__(self, rows: list[int], ranks: np.ndarray | list[float], ttft: np.ndarray | None = None) -> None:
        self.rows, self.ranks = rows, ranks
        self.ttft = ttft  # an LLM request's: each row's TTFT as the contract predicts it (no measured overhead)

    def __getitem__(self, r: int) -> float:
        return float(self.ranks[self.rows.index(r)])

    def ttft_of(self, r: int) -> float | None:
        return None if self.ttft is None else float(self.ttft[self.rows.index(r)])

    def as_dict(self) -> dict[int, float]:
        ranks = self.ranks
        return dict(zip(self.rows, ranks.tolist() if isinstance(ranks, np.ndarray) else ranks))


class Picker:
    """`choose(...)` the candidate for one request; `release_host(...)` for a rebalance."""

    def __init__(self, hysteresis: float = 0.05, hysteresis_abs: float = 2e-3) -> None:
        self.hysteresis = hysteresis
        self.hysteresis_abs = hysteresis_abs
        self._sticky: dict[str, int] = {}  # affinity key -> topology GPU
        self._sessions: dict[str, int] = {}  # session -> topology GPU
        self.in_flight = InFlightCounts()  # this gateway's requests in flight per GPU (`begin`/`end` by the gateway)
        self.prefixes = PrefixIndex()  # which GPUs served which prompt prefixes (`signals/prefix_affinity.py`)
        self._rows_of: Topology | None = None  # the topology `_rows` maps the GPU keys of
        self._rows: dict[str, int] = {}
        # the last choice's TTFT as the contract predicts it (an LLM request's; None otherwise), read with the
        # choice under the placer's lock: the plan carries it, and the gateway compares its first token with it
        self.predicted: float | None = None

    def choose(self, t: Topology, ev: Evaluated, contract: Contract, session: str | None,
               key: str, readings: Readings = NO_READINGS,
               catalog: Mapping[str, GpuClass] | None = None) -> tuple[int, SessionMove | None, str | Note | None]:
        """The chosen candidate (a row of `ev`, which has a feasible one: `ev.best >= 0`),
        a session's move, and the note the plan gives for the choice (None: the best).
        `readings`: the snapshot's measured state; `catalog`: the GPU classes (for the
        predicted TTFT of an LLM request picked on its body)."""
        best = ev.best
        self.predicted = None
        if session is not None:
            return self._session_choice(t, session, ev.evaluation(), np.array(ev.feasible, dtype=np.int64), best,
                                        contract)
        rank: Sequence[float] | Adjusted = ev.rank
        note: Note | str | None = None
        facts = CURRENT.get()
        if facts is not None and (contract.llm is None or not catalog):
            facts = None  # no per-token prefill cost to price this prompt with
        if facts is not None or self.in_flight.busy():  # read at every pick (no herding in a tick)
            best, rank, note = self._adjusted(t, ev, best, contract, facts, readings, catalog or {})
        choice: int = best
        prev = self._sticky.get(key)
        if prev is not None:
            r = ev.first_feasible_on(prev)
            if r >= 0 and r != best and rank[r] <= rank[best] * (1 + self.hysteresis) + self.hysteresis_abs:
                choice = r
                note = Kept(t, prev, ev.gpus[best], self.hysteresis, self.hysteresis_abs)
        self._sticky[key] = ev.gpus[choice]
        self.predicted = rank.ttft_of(choice) if isinstance(rank, Adjusted) else None
        if facts is not None and facts.prefix:
            self.prefixes.record(facts.prefix, t.gpu_keys[int(ev.gpus[choice])])
        return choice, None, note

    def _adjusted(self, t: Topology, ev: Evaluated, best: int, contract: Contract, facts: RequestFacts | None,
                  readings: Readings, catalog: Mapping[str, GpuClass]) -> tuple[int, Adjusted, str | Note | None]:
        """The best feasible row once each candidate's rank has the request-stage signals'
        seconds added (in flight; this prompt's predicted TTFT less its prefix credit; past
        the request's TTFT SLO: `LATE`), the feasible rows' ranks so adjusted, and the
        plan's line when they moved the choice off the model's best.

        Vectorised over the feasible candidates by their GPU's topology row (ints, not key
        strings): the in-flight counts are arrays by row (`InFlightCounts.gather_rows`), the
        per-token prefill an array by GPU class (`PredictedTtft.per_token_by_model`), the
        readings and the prefix index visited once for the few GPUs they name. A key string is
        made only for the plan's lines. `tests/placer/test_pick_adjusted.py` holds it equal to
        the same rules stated GPU key by GPU key. A handful of candidates with no request
        facts (the gateway's gRPC path) takes the same steps in plain Python (`_in_flight_only`):
        there numpy's cost per call outweighs its work."""
        feas = ev.feasible
        n = len(feas)
        if facts is None and n <= SCALAR_MAX:
            return self._in_flight_only(t, ev, best)
        at = np.array(feas, dtype=np.intp)
        rows = np.asarray(ev.gpus, dtype=np.int64)[at]  # each feasible candidate's topology GPU row
        rank = np.asarray(ev.rank, dtype=np.float64)[at]
        adj = rank.copy()
        counts = secs = added = np.zeros(n)
        lines: list[str] = []
        index = self._index(t)
        names, model_idx = t.gpu_models
        classes = model_idx[rows]  # each candidate's GPU class
        if self.in_flight.busy():
            counts, secs = self.in_flight.gather_rows(t, index, len(t.gpus), rows)
            if facts is not None:  # an LLM request: the seconds per request in flight pooled by GPU class
                secs = IN_FLIGHT.pooled(secs, classes)
            added = IN_FLIGHT.added(counts, secs, rank)
            adj += added
        keys = t.gpu_keys
        ttft: np.ndarray | None = None
        n_late = 0
        base: np.ndarray | None = None
        overhead: np.ndarray | None = None  # the gateway's measured part of each candidate's prediction
        if facts is not None:
            prefill = facts.prompt_tokens * PREDICTED.per_token_by_model(contract, catalog, names)[classes]
            fresh = _readings_at(readings, keys, index, rows)
            waiting = PREDICTED.waiting_at(fresh, n)
            ttft = PREDICTED.added(prefill, waiting)
            if facts.prefix:
                matched = np.zeros(n)
                for g, depth in self.prefixes.held(facts.prefix).items():
                    row = index.get(g)
                    if row is not None:
                        matched[rows == row] = depth
                if matched.any():
                    credit = PREFIX.credit(matched, len(facts.prefix), prefill, PREFIX.saturated_at(fresh, counts))
                    ttft = ttft - credit
                    k = int(np.argmax(credit))
                    if credit[k] > 0:
                        lines.append(PREFIX.note(keys[rows[k]], float(matched[k]), len(facts.prefix), float(credit[k])))
            base = ttft  # the contract's prediction: what the gateway's measured first token is compared with
            over, prefilling = self.in_flight.first_token_rows(t, index, len(t.gpus), rows)
            if over is not None:
                overhead = PREDICTED.overhead(IN_FLIGHT.pooled(over, classes))
                ttft = ttft + overhead
            adj += ttft
            if facts.ttft_s is not None:
                # judged with the prefills ahead of this one: this gateway's requests there still without a
                # first token when they outnumber the server's measured queue (PREDICTED.ahead)
                expected = ttft if prefilling is None else ttft + PREDICTED.ahead(prefill, waiting, prefilling)
                late = PREDICTED.late(expected, facts.ttft_s)
                n_late = int(late.sum())
                tier = PREDICTED.tier(prefill, expected, facts.ttft_s)
                if tier is not None:  # the slowest class meeting the SLO with room: faster ones kept for tighter SLOs
                    adj = np.where(tier, adj, adj + LATE)
                    lines.append(PREDICTED.tier_note(int(tier.sum()), facts.ttft_s))
                elif 0 < n_late < n:  # some candidate is predicted within the SLO: one of those
                    adj = np.where(late, adj + LATE, adj)
        i = int(np.argmin(adj))
        new = feas[i]
        by_row = Adjusted(feas, adj, base)
        if ttft is not None and facts is not None:
            lines.append(PREDICTED.note(keys[rows[i]], float(ttft[i]), facts.ttft_s, n_late if 0 < n_late < n else 0,
                                        n_late < n, float(overhead[i]) if overhead is not None else 0.0))
        if new != best:
            j = feas.index(best)
            gi, gj = keys[rows[i]], keys[rows[j]]
            if counts[j] or counts[i]:
                lines.append(IN_FLIGHT.note(gj, float(counts[j]), float(secs[j]), float(added[j])) +
                             f"; chose {gi} ({float(counts[i]):g} in flight)")
            else:
                lines.append(f"chose {gi} over the model's best {gj}")
        return new, by_row, "; ".join(lines) or None

    def _in_flight_only(self, t: Topology, ev: Evaluated, best: int) -> tuple[int, Adjusted, Moved | None]:
        """`_adjusted` with no request facts, row by row: the same sums in the same order
        (IEEE doubles either way), `np.argmin`'s choice (the first least; the first NaN); its
        line is `Moved`, written only if the plan's reasons are read."""
        feas, gpus, ranks, keys = ev.feasible, ev.gpus, ev.rank, t.gpu_keys
        n = len(feas)
        counts: list[float] = [0.0] * n
        secs: list[float] = counts
        added: list[float] = counts
        if self.in_flight.busy():
            counts, secs = self.in_flight.gather_list([keys[gpus[r]] for r in feas])
            added, adj = [], []
            for r, c, s in zip(feas, counts, secs):  # one loop (a comprehension is a call of its own in 3.11)
                x = float(ranks[r])
                a = c * (s if s == s and abs(s) != INF else x)
                added.append(a)
                adj.append(x + a)
        else:
            adj = [float(ranks[r]) for r in feas]
        i, low = 0, adj[0]
        if low == low:
            for k in range(1, n):
                x = adj[k]
                if x != x:
                    i = k
                    break
                if x < low:
                    i, low = k, x
        new = feas[i]
        note = None
        if new != best:
            j = feas.index(best)
            note = Moved(keys[gpus[new]], keys[gpus[best]], counts[j], secs[j], added[j], counts[i])
        return new, Adjusted(feas, adj), note

    def _index(self, t: Topology) -> dict[str, int]:
        """Each GPU key's row in `t` (made once per topology: readings and the counters name GPUs by key)."""
        if self._rows_of is not t:
            self._rows, self._rows_of = {k: i for i, k in enumerate(t.gpu_keys)}, t
        return self._rows

    def release_host(self, t: Topology, host: int) -> tuple[tuple[str, ...], int]:
        """Forget every session and sticky choice on host `host` (so each is placed afresh):
        the sessions released, and how many sticky choices."""
        on_host = lambda g: t.gpus[g].host == host  # noqa: E731
        sessions = tuple(sorted(s for s, g in self._sessions.items() if on_host(g)))
        for s in sessions:
            del self._sessions[s]
        keys = [k for k, g in self._sticky.items() if on_host(g)]
        for k in keys:
            del self._sticky[k]
        return sessions, len(keys)

    def session_gpu(self, session: str) -> int | None:
        return self._sessions.get(session)

    def _session_choice(
        self, t: Topology, session: str, ev: Evaluation, feasible: np.ndarray, best: int, contract: Contract,
    ) -> tuple[int, SessionMove | None, str]:
        prev = self._sessions.get(session)
        feas_gpus = ev.gpus[feasible]
        if prev is not None:
            hit = np.nonzero(feas_gpus == prev)[0]
            if len(hit):
                return int(feasible[hit[0]]), None, f"session `{session}` stays on {t.gpu_key(prev)} (affinity to its state store)"
            rows = np.nonzero(ev.gpus == prev)[0]
            why = (f"{t.gpu_key(prev)} is no longer feasible ({ev.constraint(int(rows[0])).value})" if len(rows)
                   else f"{t.gpu_key(prev)} is no longer a candidate")
            # prefer the state store's NUMA node, then its host, then the best anywhere
            numa, host = t.gpus[prev].numa, t.gpus[prev].host
            for level, same in (("NUMA node", t.gpu_numa[feas_gpus] == numa), ("host", t.gpu_host[feas_gpus] == host)):  # noqa: B007 - read after the break
                if same.any():
                    opts = feasible[same]
                    choice = int(opts[np.argmin(ev.rank[opts])])
                    break
            else:
                level, choice = "cluster", best
            to = int(ev.gpus[choice])
            self._sessions[session] = to
            move = SessionMove(session, t.gpu_key(prev), t.gpu_key(to), f"{why}; moved within the same {level}")
            return choice, move, f"session `{session}` moved: {move.reason}"
        choice = best
        state = contract.session.state if contract.session is not None else None
        if state is not None and state != "remote":
            stores = np.array([t.numa[t.gpus[int(g)].numa].store.value for g in feas_gpus])
            near = feasible[stores == state]
            if len(near):
                choice = int(near[np.argmin(ev.rank[near])])
        self._sessions[session] = int(ev.gpus[choice])
        return choice, None, f"session `{session}` starts on {t.gpu_key(int(ev.gpus[choice]))}" + (
            f" (next to its {state} state store)" if state and state != "remote" else "")


def _readings_at(readings: Readings, keys: Sequence[str], index: Mapping[str, int],
                 rows: np.ndarray) -> list[tuple[int, Reading]]:
    """(candidate position, its GPU's reading) for the candidates of topology GPU `rows`
    whose GPU has a reading: by the readings when they are fewer than the candidates (a few
    model servers), else by the candidates' keys."""
    if not readings:
        return []
    if len(readings) < len(rows):
        by_row = {row: r for k, r in readings.items() if (row := index.get(k)) is not None}
        return [(i, by_row[g]) for i, g in enumerate(rows.tolist()) if g in by_row]
    get = readings.get
    return [(i, r) for i, g in enumerate(rows.tolist()) if (r := get(keys[g])) is not None]


__all__ = ["Adjusted", "Kept", "Moved", "Note", "Picker"]
