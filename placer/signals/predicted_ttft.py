"""Predicted time to first token, from the contract: this prompt's tokens times the
contract's per-token prefill cost on each candidate's GPU class (the catalog's peak at the
contract's precision and efficiency), at the server's measured queue.

    prefill(c)   = prompt_tokens × llm.prefill / rate(class of c)          (seconds)
    predicted(c) = prefill(c) × (1 + waiting(c)) − prefix credit(c) + overhead(class of c)

`waiting(c)`: the requests the server reports waiting (`queue_depth`, fresh readings only;
none or stale: 0, and the gateway's in-flight count still prices the load), each counted as
one prefill of this prompt's size on that class (the placer knows no other request's
prompt); the prefix credit is `prefix_affinity`'s (the share of the prompt the server is
likely to hold cached); the overhead is what the contract's FLOPs leave out, measured by the
gateway (`gateway_in_flight.InFlightCounts.first_token`: its first-token time less the rest of
this formula, on a server where it had nothing in flight, averaged over the candidates of the
class; 0 until measured): an engine's fixed cost per step is no prompt's FLOPs, and a class
whose fixed cost is most of a short SLO is not promised it. This is the part the anchors'
latency predictors lack: theirs are trained on one accelerator class, while the contract's FLOPs and the catalog's peaks price
the same prompt on an H100, an A100 and an L4 differently (llm-d-router#1868 asks for
heterogeneous pools).

At the pick (`Picker.choose`, request stage: the prompt is this request's), `predicted(c)`
is added to each feasible candidate's rank; and when the request carries
its own TTFT SLO (`x-slo-ttft-ms`, `request_facts.RequestFacts.ttft_s`), a candidate whose
predicted TTFT is over it is chosen only when no feasible candidate's is within it. With
`headroom` set (off by default: 0), when some candidates are expected within that fraction
of the SLO the request goes to one of the slowest class among those (the largest prefill
for this prompt: a bronze request's loose SLO is met by an idle L4, and the H100s stay free
for the gold requests only they can serve in time), the load deciding within the class —
SLO-aware tiering, as llm-d's SLO-aware router selects by headroom. It is off by default
because its one benchmark run here (benchmarks/RESULTS.md) did not show a gain on this
loaded machine. For both tests a candidate is held to the prediction with the prefills
ahead of this prompt counted as the larger of the server's measured queue and this gateway's
requests there still without a first token (`ahead`). Not the seconds of every request in
flight there (`gateway_in_flight`'s rank term, whole answers): a continuous-batching server
starts a new prompt beside the answers it is decoding, and counting whole answers kept a
gold request off a busy H100 onto an idle A100 whose fixed cost alone missed 150 ms
(benchmarks/RESULTS.md, the heterogeneous pool). The server's measured mean first-token time
is not used here: it is a lifetime mean (a histogram's sum over its count), and as a hard filter it kept every server
with a slow past out of the gold requests' reach, which then herded onto the few with a good
one (benchmarks/RESULTS.md: 51-62 % SLO attainment at 24 req/s with it, 90-91 % without, one
run each); it still ranks through `measured_ttft`. It never refuses a GPU (the SLO is the
client's; a late first token is still an answer).
"""

from __future__ import annotations

import threading
from typing import Mapping, Sequence

import numpy as np

from policyc.compiler.bundle import Contract, GpuClass
from policyc.compiler.meaning import compute_rate

from ..framework import Column, RequestInputs, Signal, Stage, Words
from ..plan import Constraint
from ..readings import Reading, Readings
from ..readings import fresh as is_fresh

WAITING = "queue_depth"


class PredictedTtft(Signal[RequestInputs]):
    name = "predicted_ttft"
    constraint = Constraint.PREDICTED_TTFT
    consumes = (WAITING,)
    stage = Stage.REQUEST  # read at the pick: the prompt is this request's (`Picker.choose`)

    def __init__(self, *, max_age_s: float = 0.25, headroom: float = 0.0) -> None:
        if not (max_age_s > 0 and 0 <= headroom <= 1):
            raise ValueError(f"predicted TTFT: max_age_s {max_age_s!r} must be positive, headroom {headroom!r} in [0, 1]")
        self.max_age_s, self.headroom = max_age_s, headroom
        self._lock = threading.Lock()
        self._per_token: dict[tuple[int, int], tuple[Contract, Mapping[str, GpuClass], dict[str, float]]] = {}
        self._by_model: dict[tuple[int, int, int], tuple[Contract, Mapping[str, GpuClass], tuple[str, ...], np.ndarray]] = {}

    def reference(self, x: RequestInputs) -> Column:
        """It never refuses: the prediction orders the feasible candidates at the pick."""
        return Column(fail=np.zeros(len(x.total), dtype=bool))

    def per_token(self, contract: Contract, catalog: Mapping[str, GpuClass]) -> dict[str, float]:
        """Seconds of prefill per prompt token on each GPU class of `catalog` the contract
        can run on (none: the contract has no `llm` block, or the class no peak at its
        precision). Kept per (contract, catalog) object."""
        key = (id(contract), id(catalog))
        hit = self._per_token.get(key)
        if hit is not None and hit[0] is contract and hit[1] is catalog:
            return hit[2]
        out: dict[str, float] = {}
        llm = contract.llm
        if llm is not None:
            for name, gpu in catalog.items():
                rate = compute_rate(contract.compute, gpu)
                if rate is not None and rate > 0:
                    out[name] = llm.prefill_flops / rate
        with self._lock:
            if len(self._per_token) > 256:
                self._per_token.clear()
            self._per_token[key] = (contract, catalog, out)
        return out

    def per_token_by_model(self, contract: Contract, catalog: Mapping[str, GpuClass], names: tuple[str, ...]) -> np.ndarray:
        """`per_token` as an array aligned with the class names `names` (a topology's
        `gpu_models`; 0 where the class has none). Kept per (contract, catalog, names) object."""
        key = (id(contract), id(catalog), id(names))
        hit = self._by_model.get(key)
        if hit is not None and hit[0] is contract and hit[1] is catalog and hit[2] is names:
            return hit[3]
        per = self.per_token(contract, catalog)
        out = np.array([per.get(n, 0.0) for n in names], dtype=np.float64)
        out.flags.writeable = False
        with self._lock:
            if len(self._by_model) > 256:
                self._by_model.clear()
            self._by_model[key] = (contract, catalog, names, out)
        return out

    def waiting_at(self, fresh: Sequence[tuple[int, Reading]], n: int) -> np.ndarray:
        """`waiting` with the readings already found: `fresh`, (candidate position, its
        reading) for the `n` candidates' that have one (the pick finds them once for both uses)."""
        out = np.zeros(n, dtype=np.float64)
        for i, r in fresh:
            if is_fresh(r, self.max_age_s):  # the bound follows the scraper's tick in use
                w = r.values.get(WAITING)
                if w is not None and 0 <= w < float("inf"):
                    out[i] = w
        return out

    def waiting(self, readings: Readings, gpus: Sequence[str]) -> np.ndarray:
        """Per GPU key: the server's fresh measured waiting queue, else 0."""
        out = np.zeros(len(gpus), dtype=np.float64)
        for i, g in enumerate(gpus):
            r = readings.get(g)
            if r is not None and is_fresh(r, self.max_age_s):
                w = r.values.get(WAITING)
                if w is not None and 0 <= w < float("inf"):
                    out[i] = w
        return out

    def late(self, expected: np.ndarray, slo: float) -> np.ndarray:
        """Which candidates are expected past `slo` (vectorised; see the module)."""
        return expected > slo

    def tier(self, prefill: np.ndarray, expected: np.ndarray, slo: float) -> np.ndarray | None:
        """The candidates of the slowest class (the largest prefill for this prompt) among
        those expected within `headroom` of `slo`, or None when none is (vectorised)."""
        if self.headroom <= 0:
            return None  # tiering off (the default)
        safe = expected <= self.headroom * slo
        if not safe.any():
            return None
        slowest = prefill[safe].max()
        return safe & (prefill >= slowest * (1 - 1e-9))

    def tier_note(self, n: int, slo: float) -> str:
        return (f"{n} candidate(s) of the slowest class expected within {self.headroom:.0%} of the request's "
                f"{slo * 1e3:g} ms TTFT: the faster classes kept for tighter SLOs")

    def added(self, prefill: np.ndarray, waiting: np.ndarray) -> np.ndarray:
        """Seconds added to each candidate's rank (vectorised): its prefill at its queue."""
        return prefill * (1.0 + waiting)

    def added_reference(self, prefill: Sequence[float], waiting: Sequence[float]) -> list[float]:
        """`added`, candidate by candidate (the test holds the two equal)."""
        return [p * (1.0 + w) for p, w in zip(prefill, waiting)]

    def ahead(self, prefill: np.ndarray, waiting: np.ndarray, prefilling: np.ndarray) -> np.ndarray:
        """Seconds added to each candidate's prediction for the SLO test (vectorised): the
        prefills of this gateway's requests there still without a first token
        (`InFlightCounts.prefilling`) beyond the server's measured queue, each one prefill of
        this prompt's size (a fresher count than the scraped queue, which others' traffic
        fills too: the larger of the two is taken)."""
        return prefill * np.maximum(prefilling - waiting, 0.0)

    def overhead(self, measured: np.ndarray) -> np.ndarray:
        """Seconds added to each candidate's prediction (vectorised): its class's measured
        first-token seconds over the contract's (`InFlightCounts.first_token`, pooled by class),
        none where unmeasured, never below zero (a prefix cache credited too little does not
        make a class faster than its FLOPs)."""
        return np.where(np.isfinite(measured) & (measured > 0), measured, 0.0)

    def detail(self, w: Words, r: int) -> str:
        return "predicted TTFT never refuses a GPU"

    def note(self, gpu: str, predicted: float, slo: float | None, late: int, within: bool = True,
             measured: float = 0.0) -> str:
        """The plan's line: the chosen GPU's predicted TTFT, against the request's SLO (`late`:
        the candidates passed over as predicted past it; `within`: the chosen one is not), and
        where it comes from: the contract's prefill at the server's queue, and `measured`, the
        part the gateway measured on the class (`overhead`)."""
        source = ("the contract's prefill on its class at its queue"
                  + (f", {measured * 1e3:.1f} ms of it the gateway's measured first-token overhead on the class"
                     if measured > 0 else ""))
        if slo is None:
            return f"predicted TTFT on {gpu}: {predicted * 1e3:.1f} ms ({source})"
        if not within:
            return (f"predicted TTFT on {gpu}: {predicted * 1e3:.1f} ms ({source}); no feasible candidate is predicted "
                    f"within the request's {slo * 1e3:g} ms (with the prefills ahead of it), the load decides")
        return (f"predicted TTFT on {gpu}: {predicted * 1e3:.1f} ms ({source}) within the request's {slo * 1e3:g} ms"
                + (f" ({late} feasible candidate(s) predicted later, passed over)" if late else ""))


__all__ = ["PredictedTtft"]
