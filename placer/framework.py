"""Placement signals: the filter → score → pick of the Inference Extension, done with columns.

A signal is one thing the placer reads about a candidate GPU and the refusal it names when
the GPU fails it (GPU class, health, free share, PCIe, session store, port, network,
dependencies, queue depth, latency budget). Each one is a file under `signals/`, registered
by name in the order refusals are ranked (`signals.ORDER`). A signal declares:

- `name`, `constraint` (the word a refusal names) and `consumes` (the telemetry keys it
  reads: a `TelemetryFrame` field, or a key of the measured readings);
- `stage`: what its column depends on, hence when it is computed: once per contract and
  topology (`CONTRACT`), once per tick (`TICK`: snapshot, thresholds, ingress), once per
  tick and contract (`TICK_CONTRACT`), or per request (`REQUEST`: the share reserved so
  far this tick and the request's budget);
- `reference(x)`: the plain statement of the signal over the candidates `x.gpus`, which the
  reference evaluation (`evaluate.evaluate`) runs; and `column(x)`, the same figures for
  every GPU at once, which the per-tick tables run (`contract_table`, `paths`,
  `tick_table`). Both return a `Column` (numpy arrays: the GPUs refused, seconds added to
  the prediction, readings too old to use): columns in, columns out, never a callback per
  candidate. `column` defaults to `reference` over every GPU; a signal overrides it where
  a faster way exists (per GPU class, per dependency table), and the tests hold each
  signal's column equal to its reference (`tests/placer/test_signals.py`);
- `detail(w, r)`: the words of a refusal of candidate `r`, and `plan_note(snap, gpu)`: a
  line for the plan (a measured value that was too old and fell back).

The two runners: `evaluate.evaluate` (reference, per request, over the candidates) and
the tables (`contract_table`, `paths`, `tick_table`, then `lookup`'s per-request gather).
A new signal in the `CONTRACT` or `TICK` stage is one file and its registration: the
tables fold its refusals into their constraint codes and its seconds into the `wait`
column, which both runners add to the predicted queueing. `REQUEST`-stage signals (share
and budget) are the runners' own per-request arithmetic (`lookup.scalar_rows` unrolls it
for a handful of candidates, where numpy's per-call overhead is most of the cost); their
files hold the vectorised filter and the words.

Measured state (the model servers' own metrics) reaches signals as readings: per GPU key
(`host/gpuN`, the GPU an endpoint's server runs on), the values by key and their age
(`Reading`, the shape the metrics scraper's `snapshot(endpoint)` returns). A value older
than its signal's bound is stale: the signal excludes the GPU or falls back, as it
declares (`OnStale`), and says so in the refusal or the plan; it never uses the old number.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Callable, ClassVar, Generic, Mapping, TypeVar

import numpy as np

from .latency import pcie_delay
from .plan import Constraint
from .port_paths import PortPaths, best_ports
from .readings import Reading, Readings

if TYPE_CHECKING:
    from policyc.compiler.bundle import Contract, GpuClass

    from .evaluate import Evaluation
    from .paths import PathTable
    from .shares import ShareBound
    from .snapshot import Snapshot
    from .thresholds import Thresholds
    from .topology import Topology


class Stage(str, Enum):
    """What a signal's column depends on, and so how often it is computed."""

    CONTRACT = "contract"  # the contract and the topology (with the catalog): once per contract table
    TICK = "tick"  # the snapshot, thresholds and ingress: once per path table
    TICK_CONTRACT = "tick_contract"  # both: once per (tick, contract) table
    REQUEST = "request"  # the request's reservations and budget: the runners' per-request arithmetic


class OnStale(str, Enum):
    """What a signal does with a reading older than its bound."""

    EXCLUDE = "exclude"  # refuse the GPU, naming the stale reading
    FALL_BACK = "fall_back"  # leave the term out (the model's prediction stands) and say so in the plan


@dataclass(frozen=True, slots=True)
class Column:
    """A signal's figures over a list of GPUs (aligned with the inputs' `gpus`); None where
    the signal has nothing to say (no refusal, no seconds, nothing stale)."""

    fail: np.ndarray | None = None  # bool: the signal refuses the GPU
    latency: np.ndarray | None = None  # seconds the signal adds to the predicted queueing
    stale: np.ndarray | None = None  # bool: a reading was too old and the signal fell back
    extra: tuple = ()  # a signal's own figures the runners pass on (dependency bindings)

    def at(self, rows: np.ndarray) -> "Column":
        """The column at `rows` (a gather: the tables' column at the candidates)."""
        pick = lambda a: None if a is None else a[rows]  # noqa: E731
        return Column(pick(self.fail), pick(self.latency), pick(self.stale), self.extra)


NOTHING = Column()
EVERY = slice(None)  # the tables' `gpus`: every GPU of the topology, in order (a view, not a gather)


@dataclass(eq=False)
class ContractInputs:
    """What a `CONTRACT` signal reads: the contract, the structure and the catalog, over
    `gpus` (topology indices: the candidates, or every GPU)."""

    topology: "Topology"
    contract: "Contract"
    catalog: "Mapping[str, GpuClass]"
    bounds: "Mapping[str, ShareBound]"  # per GPU class of the topology
    gpus: "np.ndarray | slice"  # topology indices, or EVERY


@dataclass(eq=False)
class TickInputs:
    """What a `TICK` signal reads: the snapshot and thresholds, over `gpus` entered from
    `rows` (each GPU's row of the fabric distance tables). `paths` (each GPU's best way onto
    the fabric) is worked out on first use and shared by the signals that read it."""

    snap: "Snapshot"
    th: "Thresholds"
    gpus: "np.ndarray | slice"  # topology indices, or EVERY
    rows: np.ndarray
    _paths: "PortPaths | None" = field(default=None, repr=False)

    @property
    def paths(self) -> "PortPaths":
        p = self._paths
        if p is None:
            local, remote = self.snap.topology.gpu_ports
            g = self.gpus
            p = self._paths = best_ports(self.snap, self.th, local[g], remote[g], self.rows,
                                         pcie_delay(self.snap.frame.gpu_pcie_util[g]))
        return p


@dataclass(eq=False)
class TickContractInputs:
    """What a `TICK_CONTRACT` signal reads: the tick's inputs and the contract; the tables'
    runner passes the tick's path table (`table`), whose dependency tables it shares."""

    snap: "Snapshot"
    contract: "Contract"
    tick: TickInputs | None = None  # the reference's: the candidates' paths
    table: "PathTable | None" = None  # the tables': every GPU's


@dataclass(eq=False)
class RequestInputs:
    """What a `REQUEST` signal reads, aligned with the candidates: the free share less what
    this tick reserved, the share the contract needs, the predicted total and the budget
    share it must stay within."""

    free: np.ndarray
    min_share: np.ndarray
    total: np.ndarray
    limit: float


@dataclass(eq=False)
class Words:
    """What a refusal's words read: the snapshot, thresholds, the evaluation, the contract's
    share bounds, the budget, and the share placed on a GPU since the snapshot (`held`)."""

    snap: "Snapshot"
    th: "Thresholds"
    ev: "Evaluation"
    bounds: "Mapping[str, ShareBound]"
    budget: float
    held: Callable[[int], float]


X = TypeVar("X", ContractInputs, TickInputs, TickContractInputs, RequestInputs)  # a stage's inputs


class Signal(ABC, Generic[X]):
    """One placement signal (see the module's docstring), reading its stage's inputs `X`."""

    name: ClassVar[str]
    constraint: ClassVar[Constraint]
    consumes: ClassVar[tuple[str, ...]]
    stage: ClassVar[Stage]
    reads_paths: ClassVar[bool] = False  # a TICK signal reading `TickInputs.paths` (the tables build them first)

    @abstractmethod
    def reference(self, x: X) -> Column:
        """The signal over the candidates `x.gpus`, stated plainly (the reference runner)."""

    def column(self, x: X) -> Column:
        """The signal over every GPU (`x.gpus` is every GPU), for the per-tick tables."""
        return self.reference(x)

    @abstractmethod
    def detail(self, w: Words, r: int) -> str:
        """Why candidate `r` of `w.ev` fails this signal, in words."""

    def plan_note(self, snap: "Snapshot", gpu: int) -> str | None:
        """A line for a plan placed on `gpu` (a stale reading it fell back from), or None."""
        return None


__all__ = [
    "EVERY", "NOTHING", "Column", "ContractInputs", "OnStale", "Reading", "Readings", "RequestInputs", "Signal", "Stage",
    "TickContractInputs", "TickInputs", "Words",
]
