"""Gateway in flight: the requests this gateway has sent to a GPU's server and not yet seen
end, counted by the gateway itself (measured key `gateway_in_flight`), read at every pick.

Why it is not a per-tick column: every other measured signal is read once per tick, so all
the picks of one tick see the same scores and go to the same best GPU (herding; with a 50 ms
tick and a burst of requests, one server takes them all). The peers avoid it with a count
updated on every pick (Envoy's least-request, vllm-router's power-of-two). This signal is
that count: `InFlightCounts` is incremented when the picker forwards a pick whose end it
will learn (`begin`, with the pick's decision id and GPU) and decremented when the gateway
learns the request ended (`end`: Envoy's access-log entry for the call, the end of the
ext_proc stream when the access log is not followed, or, for an LLM answer, the stream
supervisor's view of its attempt ending), so the next pick, not the next tick, sees it.

What it adds to a feasible candidate's rank, at the pick (`Picker.choose`): its count times
the seconds one request holds that GPU, `seconds` — the mean duration of this gateway's own
completed requests there (an exponentially weighted mean, `ALPHA`, measured from `begin` to
`end` on the gateway's monotonic clock: where the GPU class's real speed shows); before any
request there has completed, the same mean over every GPU of this gateway, and before any
has completed anywhere, the candidate's own predicted rank (the latency model's). For an LLM
request the seconds are averaged over the candidates of the same GPU class (`pooled`; why,
below).
A request's whole duration is counted per request ahead, as if the server served them one
at a time: an upper bound for a batching server, the same bound on every GPU. It never
refuses a GPU (`reference`: no refusal; the budget and share signals decide feasibility).

Why pooled by class: an LLM request's duration is mostly its output length (16 or 64 tokens
is a 4x spread), so one GPU's mean follows the last few requests it served, not its speed.
Per GPU, two equal vLLM servers read 1,489 and 200 ms a request in one run
(benchmarks/RESULTS.md): one request in flight on the first outweighed four on the second,
80 % of the requests went to one server, and its queue missed the gold SLOs. GPUs of one
class are declared equally fast, so their samples estimate one figure: within a class the
count decides (least request), across classes their measured speeds still do. A unary call's
duration does not spread so (its answer is one message), and its pick (`_in_flight_only`, a
handful of candidates in plain Python) stays per GPU, without the pooling's cost.

Bounded: at most `max_open` requests are tracked (the oldest is forgotten first) and one
whose end never comes is forgotten after `max_age_s`, so a lost access-log entry cannot
leave a GPU counted busy for ever. One counter per placer (the picker's), thread-safe.

The same counters learn, for an LLM request, what the contract's prediction of its first
token leaves out (`first_token`): the gateway's measured time to its first token less the
contract's predicted TTFT (`signals/predicted_ttft.py`), on a server where this gateway had
nothing in flight when it was picked (so the difference is not a queue, which the count
prices): the engine's fixed cost per step, the HTTP and tokenizer path, a class that runs
below its catalog peak. An exponentially weighted mean per GPU (`first_token_rows`), which the
pick pools over each GPU class as it pools the seconds in flight."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Mapping, Sequence

import numpy as np

from ..framework import Column, RequestInputs, Signal, Stage, Words
from ..plan import Constraint

KEY = "gateway_in_flight"
INF = float("inf")
ALPHA = 0.2  # the weight of the latest duration in a GPU's mean
MAX_TTFT_S = 600.0  # a first-token time beyond this is not a measurement the overhead learns from


class _Open:
    """One request in flight: its GPU, when it began, the contract's predicted TTFT to learn
    the overhead from (an LLM request picked onto an idle GPU, until its first token), and
    whether it still waits for its first token (an LLM request: `prefilling`)."""

    __slots__ = ("gpu", "began", "predicted", "prefilling")

    def __init__(self, gpu: str, began: float, predicted: float | None, prefilling: bool) -> None:
        self.gpu, self.began, self.predicted, self.prefilling = gpu, began, predicted, prefilling


class InFlightCounts:
    """The live counters: per GPU key, the requests in flight from this gateway and the mean
    measured duration of those that ended (see the module's docstring)."""

    def __init__(self, *, max_open: int = 100_000, max_age_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (max_open > 0 and max_age_s > 0):
            raise ValueError(f"gateway in-flight counts: max_open {max_open!r} and max_age_s {max_age_s!r} must be positive")
        self.max_open, self.max_age_s, self._clock = max_open, max_age_s, clock
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Open] = OrderedDict()  # decision id -> its request, oldest first
        self._count: dict[str, int] = {}
        self._prefilling: dict[str, int] = {}  # per GPU: the LLM requests in flight without their first token
        self._seconds: dict[str, float] = {}
        self._every: float | None = None  # the same mean over every GPU (a GPU's own stands in for it once measured)
        self._overhead: dict[str, float] = {}  # per GPU: measured first-token seconds less the contract's prediction
        self.forgotten = 0  # requests whose end never came (expired or pushed out)
        # the same counts and means as arrays by the GPU row of one topology (`gather_rows`: the pick reads
        # them by fancy index, not key by key), kept in step with the dicts and rebuilt when the topology changes
        self._owner: object | None = None
        self._row: Mapping[str, int] = {}
        self._count_at = np.zeros(0)
        self._prefilling_at = np.zeros(0)
        self._seconds_at = np.full(0, np.nan)  # NaN: none ended there (a measured duration is never NaN)
        self._overhead_at = np.full(0, np.nan)  # NaN: no first token measured there yet

    def begin(self, decision_id: str, gpu: str, predicted_ttft: float | None = None) -> None:
        """A pick forwarded to `gpu` (`host/gpuN`); `predicted_ttft`: an LLM request's TTFT as
        the contract predicts it there (the request counts as prefilling until its first token;
        the prediction is learned from only when nothing of this gateway's is in flight on
        `gpu`: see `first_token`)."""
        now = self._clock()
        with self._lock:
            if decision_id in self._open:
                return
            self._expire(now)
            idle = gpu not in self._count
            llm = predicted_ttft is not None
            ok = predicted_ttft is not None and idle and 0 <= predicted_ttft < MAX_TTFT_S
            self._open[decision_id] = _Open(gpu, now, predicted_ttft if ok else None, llm)
            self._count[gpu] = self._count.get(gpu, 0) + 1
            i = self._row.get(gpu)
            if i is not None:
                self._count_at[i] += 1
            if llm:
                self._prefilling[gpu] = self._prefilling.get(gpu, 0) + 1
                if i is not None:
                    self._prefilling_at[i] += 1

    def end(self, decision_id: str) -> float | None:
        """The request ended: its GPU's count falls and its duration enters the GPU's mean.
        Returns the duration (None: not begun here, or already ended or forgotten)."""
        now = self._clock()
        with self._lock:
            got = self._open.pop(decision_id, None)
            if got is None:
                return None
            gpu, began = got.gpu, got.began
            self._drop(got)
            took = max(now - began, 0.0)
            prev = self._seconds.get(gpu)
            self._seconds[gpu] = mean = took if prev is None else prev + ALPHA * (took - prev)
            i = self._row.get(gpu)
            if i is not None:
                self._seconds_at[i] = mean
            every = self._every
            self._every = took if every is None else every + ALPHA * (took - every)
            return took

    def first_token(self, decision_id: str, seconds: float) -> float | None:
        """The first token of a request begun here came `seconds` after its first attempt was
        sent (the stream supervisor's measurement): it no longer counts as prefilling; if it
        was picked onto an idle GPU with a prediction, the difference enters that GPU's
        overhead (once per request). Returns the difference learned (None: nothing learned)."""
        with self._lock:
            got = self._open.get(decision_id)
            if got is None:
                return None
            self._prefilled(got)
            predicted, got.predicted = got.predicted, None  # learned once
            if predicted is None or not (0 <= seconds < MAX_TTFT_S):
                return None
            gpu = got.gpu
            sample = seconds - predicted
            prev = self._overhead.get(gpu)
            self._overhead[gpu] = mean = sample if prev is None else prev + ALPHA * (sample - prev)
            i = self._row.get(gpu)
            if i is not None:
                self._overhead_at[i] = mean
            return sample

    def overhead(self, gpu: str) -> float | None:
        """`gpu`'s mean measured first-token seconds over the contract's prediction (None: none yet)."""
        return self._overhead.get(gpu)

    def prefilling(self, gpu: str) -> int:
        """`gpu`'s LLM requests from this gateway still waiting for their first token."""
        return self._prefilling.get(gpu, 0)

    def first_token_rows(self, owner: object, rows: Mapping[str, int], n: int,
                         at: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """By GPU row (as `gather_rows`): the overhead (NaN: none measured there) and the
        requests prefilling; None for either when no GPU has one (the pick skips its terms)."""
        with self._lock:
            self._expire(self._clock())
            if owner is not self._owner or len(self._count_at) != n:
                self._bind(owner, rows, n)
            return (self._overhead_at[at] if self._overhead else None,
                    self._prefilling_at[at] if self._prefilling else None)

    def busy(self) -> bool:
        """Whether anything is in flight (the picker's fast path skips the gather when not)."""
        return bool(self._count)

    def count(self, gpu: str) -> int:
        return self._count.get(gpu, 0)

    def seconds(self, gpu: str) -> float | None:
        return self._seconds.get(gpu)

    def measured(self) -> dict[str, float]:
        """Every GPU's mean measured seconds per request (those where a request ended)."""
        with self._lock:
            return dict(self._seconds)

    def gather(self, gpus: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per GPU key: the count in flight and the mean measured seconds (a GPU where none
        ended: the mean over every GPU; NaN: none ended anywhere)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            c, s = self._count, self._seconds
            counts = np.array([c.get(g, 0) for g in gpus], dtype=np.float64)
            every = np.nan if self._every is None else self._every
            secs = np.array([s.get(g, every) for g in gpus], dtype=np.float64)
        return counts, secs

    def gather_list(self, gpus: Sequence[str]) -> tuple[list[float], list[float]]:
        """`gather` as lists (a handful of GPUs: the pick's plain-Python path)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            c, s = self._count, self._seconds
            every = np.nan if self._every is None else self._every
            counts, secs = [], []
            for g in gpus:
                counts.append(float(c.get(g, 0)))
                secs.append(float(s.get(g, every)))
            return counts, secs

    def gather_rows(self, owner: object, rows: Mapping[str, int], n: int, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`gather` by GPU row: `at`, rows of the topology `owner` whose GPU keys `rows` maps to
        their rows (`n` of them). The arrays follow one topology; another rebuilds them (once)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            if owner is not self._owner or len(self._count_at) != n:
                self._bind(owner, rows, n)
            counts = self._count_at[at]
            s = self._seconds_at[at]
            secs = s if self._every is None else np.where(np.isnan(s), self._every, s)
        return counts, secs

    def _bind(self, owner: object, rows: Mapping[str, int], n: int) -> None:
        """The arrays rebuilt for `owner`'s rows from the dicts (under the lock)."""
        count_at, prefilling_at = np.zeros(n), np.zeros(n)
        seconds_at, overhead_at = np.full(n, np.nan), np.full(n, np.nan)
        for counts, out in ((self._count, count_at), (self._prefilling, prefilling_at)):
            for g, k in counts.items():
                if (i := rows.get(g)) is not None:
                    out[i] = k
        for values, out in ((self._seconds, seconds_at), (self._overhead, overhead_at)):
            for g, v in values.items():
                if (i := rows.get(g)) is not None:
                    out[i] = v
        self._owner, self._row, self._count_at, self._seconds_at = owner, rows, count_at, seconds_at
        self._overhead_at, self._prefilling_at = overhead_at, prefilling_at

    def _drop(self, got: _Open) -> None:
        """`got` is no longer in flight (under the lock)."""
        self._prefilled(got)
        self._fall(self._count, self._count_at, got.gpu)

    def _prefilled(self, got: _Open) -> None:
        """`got` no longer waits for its first token (under the lock; once)."""
        if got.prefilling:
            got.prefilling = False
            self._fall(self._prefilling, self._prefilling_at, got.gpu)

    def _fall(self, counts: dict[str, int], at: np.ndarray, gpu: str) -> None:
        """One fewer for `gpu` in `counts` and in its row of `at` (under the lock)."""
        n = counts.get(gpu, 0) - 1
        if n > 0:
            counts[gpu] = n
        else:
            counts.pop(gpu, None)
        i = self._row.get(gpu)
        if i is not None:
            at[i] = max(n, 0)

    def _expire(self, now: float) -> None:
        """Forget the oldest requests past `max_age_s`, or beyond `max_open` (under the lock)."""
        op = self._open
        while op:
            did, got = next(iter(op.items()))
            if now - got.began < self.max_age_s and len(op) < self.max_open:
                return
            del op[did]
            self._drop(got)
            self.forgotten += 1


class GatewayInFlight(Signal[RequestInputs]):
    name = "gateway_in_flight"
    constraint = Constraint.GATEWAY_IN_FLIGHT
    consumes = (KEY,)
    stage = Stage.REQUEST  # read per pick, from the live counts (`Picker.choose`), not from a tick's table

    def reference(self, x: RequestInputs) -> Column:
        """It never refuses: the count only orders the feasible candidates at the pick."""
        return Column(fail=np.zeros(len(x.total), dtype=bool))

    def added(self, counts: np.ndarray, seconds: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Seconds added to each candidate's rank (vectorised): count × measured seconds per
        request there, or × the candidate's own predicted rank before any has ended."""
        return counts * np.where(np.isfinite(seconds), seconds, rank)

    def pooled(self, seconds: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """Each candidate's seconds per request pooled over the candidates of its GPU class
        (`classes`: a small non-negative class index per candidate, `Topology.gpu_models`): the
        mean of their finite seconds, NaN for a class where none has one (vectorised; summed in
        candidate order, as `pooled_reference`)."""
        ok = np.isfinite(seconds)
        sums = np.bincount(classes, weights=np.where(ok, seconds, 0.0))
        ns = np.bincount(classes, weights=ok)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (sums / ns)[classes]

    def pooled_reference(self, seconds: Sequence[float], classes: Sequence[int]) -> list[float]:
        """`pooled`, stated candidate by candidate (the test holds the two equal)."""
        by: dict[int, list[float]] = {}
        for s, c in zip(seconds, classes):
            if s == s and s != INF and s != -INF:
                t = by.get(c)
                if t is None:
                    by[c] = [s, 1.0]
                else:
                    t[0] += s
                    t[1] += 1.0
        nan = float("nan")
        return [t[0] / t[1] if (t := by.get(c)) is not None else nan for c in classes]

    def added_reference(self, counts: Sequence[float], seconds: Sequence[float], rank: Sequence[float]) -> list[float]:
        """`added`, stated candidate by candidate (the test holds the two equal)."""
        return [n * (s if s == s and abs(s) != float("inf") else r) for n, s, r in zip(counts, seconds, rank)]

    def detail(self, w: Words, r: int) -> str:
        return "gateway in flight never refuses a GPU"

    def note(self, gpu: str, count: float, seconds: float, added: float) -> str:
        """The plan's line when the count moved the choice off the model's best."""
        per = f"{seconds * 1e3:.0f} ms measured per request" if seconds == seconds else "the predicted rank per request"
        return f"in flight from this gateway on {gpu}: {count:g} ({per}, +{added * 1e3:.1f} ms)"


__all__ = ["ALPHA", "KEY", "GatewayInFlight", "InFlightCounts"]
