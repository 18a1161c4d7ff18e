"""What a placement returns: a plan with its predicted latency and reasons, or a refusal
that names the binding constraint. Immutable data, safe to log, audit and send on the wire.

`PlacementPlan` and `LatencyBreakdown` are made for every placed request on the serving
loop, so they are slotted dataclasses that nothing assigns to after construction rather
than `frozen=True` ones, whose `__init__` sets each field through `object.__setattr__`
(about 8x the cost of a plain slot: `server/decision.py`); `unsafe_hash` keeps them
hashable as frozen ones were.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable


class Constraint(str, Enum):
    """Why a candidate GPU was not chosen (and, for a refusal, what bound)."""

    INPUT = "input"  # the request itself is unusable (budget, ingress)
    NO_CANDIDATES = "no_candidates"
    UNKNOWN_GPU = "unknown_gpu"  # the instance's GPU is not in the topology
    GPU_CLASS = "gpu_class"  # the solver (or the catalog) rules the class out
    HEALTH = "health"  # failed, anomalous, or SM throughput collapsed
    GPU_SHARE = "gpu_share"  # not enough free share for the solver's lower bound
    PCIE = "pcie"
    PORT = "port"  # RDMA port down or over its watermark / utilisation threshold
    PORT_BACKLOG = "port_backlog"  # the host agent's measured qdisc backlog over the watermark, or the link down
    NETWORK = "network"  # no path from the ingress without crossing a congested hop
    DEPENDENCY = "dependency"  # a declared service not reachable within its p99 bound
    SESSION_STORE = "session_store"
    QUEUE_DEPTH = "queue_depth"  # the model server's measured queue too deep, or its reading stale
    RUNNING_REQUESTS = "running_requests"  # the model server's measured batch too full, or its reading stale
    KV_CACHE = "kv_cache"  # the model server's measured KV-cache use near full, or its reading stale
    MEASURED_TTFT = "measured_ttft"  # the model server's measured mean time to first token over its bound, or stale
    LATENCY_BUDGET = "latency_budget"
    GATEWAY_IN_FLIGHT = "gateway_in_flight"  # never refuses: this gateway's own requests in flight, read at the pick
    PREFIX_AFFINITY = "prefix_affinity"  # never refuses: the server that served this prompt's leading blocks, read at the pick
    PREDICTED_TTFT = "predicted_ttft"  # never refuses: this prompt's prefill on the GPU's class at its queue, read at the pick
    INTERNAL = "internal"


class ShareSource(str, Enum):
    SOLVER = "solver"
    CATALOG = "catalog"  # computed here: the bundle had no solver entry for the class
    REQUEST = "request"  # an LLM request priced by its own tokens on the catalog (`llm_price.py`)


@dataclass(slots=True, unsafe_hash=True)  # immutable: never assigned to (see above)
class LatencyBreakdown:
    """Predicted end-to-end seconds. `network` is the round trip from the ingress,
    including switch and port buffers; `queueing` the wait at the GPU; `dependencies` the
    declared services' calls; `sigma` the predicted spread (one standard deviation)."""

    network: float
    queueing: float
    compute: float
    dependencies: float
    sigma: float

    @property
    def total(self) -> float:
        return self.network + self.queueing + self.compute + self.dependencies

    def describe(self) -> str:
        ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
        return (f"{ms(self.total)} ± {ms(self.sigma)} (network {ms(self.network)}, queueing {ms(self.queueing)}, "
                f"compute {ms(self.compute)}, dependencies {ms(self.dependencies)})")


@dataclass(frozen=True, slots=True)
class DependencyBinding:
    service: str  # the contract's dependency name
    kind: str
    endpoint: str  # the endpoint the plan binds it to
    role: str  # direct | shared | dedicated
    predicted: float  # seconds: round trip + endpoint p99
    bound: float  # the contract's p99 bound


@dataclass(frozen=True, slots=True)
class SessionMove:
    session: str
    from_gpu: str
    to_gpu: str
    reason: str


@dataclass(frozen=True, slots=True)
class Rejection:
    gpu: str  # host/gpuN (or the instance id when the GPU is unknown)
    constraint: Constraint
    detail: str


class Explanation:
    """A plan's reasons and rejections, written on first read.

    Building the text (runner-up, share source, dependency bindings, why each rejected
    candidate failed) costs more than choosing the GPU, and most plans are never read by
    a person. The plan keeps a function that writes it from the immutable snapshot and
    evaluation the choice was made on, so reading it later gives the same words. The
    first read runs it once and drops the function (and the snapshot it holds).
    """

    __slots__ = ("_write", "_value")

    # One lock for every explanation's first read: reads are rare and short, and a lock per
    # plan was one more object made on every decision.
    _lock = threading.RLock()

    def __init__(self, write: Callable[[], tuple[tuple[str, ...], tuple["Rejection", ...]]]) -> None:
        self._write: Callable[[], tuple[tuple[str, ...], tuple[Rejection, ...]]] | None = write
        self._value: tuple[tuple[str, ...], tuple[Rejection, ...]] | None = None

    @staticmethod
    def of(reasons: tuple[str, ...] = (), rejected: tuple["Rejection", ...] = ()) -> "Explanation":
        """An explanation already written."""
        e = Explanation(lambda: (reasons, rejected))
        e.resolve()
        return e

    def resolve(self) -> tuple[tuple[str, ...], tuple["Rejection", ...]]:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    assert self._write is not None
                    self._value, self._write = self._write(), None
                value = self._value
        return value

    def __copy__(self) -> "Explanation":
        return self

    def __deepcopy__(self, memo: dict) -> "Explanation":
        reasons, rejected = self.resolve()
        return Explanation.of(reasons, rejected)

    def __repr__(self) -> str:
        return "Explanation(written)" if self._value is not None else "Explanation(pending)"


@dataclass(slots=True, unsafe_hash=True)  # immutable: never assigned to (see above)
class PlacementPlan:
    instance_id: str
    host: str
    gpu: str
    gpu_model: str
    numa_node: int
    cpus: tuple[int, ...]
    rdma_port: str | None
    queue_depth: int
    probes: tuple[str, ...]
    latency: LatencyBreakdown
    share: float  # the GPU share reserved for the request
    share_source: ShareSource
    dependencies: tuple[DependencyBinding, ...]
    session_move: SessionMove | None
    stale: bool
    snapshot_version: int
    explanation: Explanation = field(default_factory=Explanation.of, repr=False, compare=False)
    feasible: bool = True
    # an LLM request's TTFT on this GPU as the contract predicts it (prefill at its queue, less the prefix credit;
    # `signals/predicted_ttft.py`), before the measured overhead: the gateway learns that overhead from it
    contract_ttft_s: float | None = None

    @property
    def gpu_key(self) -> str:
        return f"{self.host}/{self.gpu}"

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why this GPU: the choice and its runner-up, the share's source, dependency
        bindings, hysteresis / session notes, counts of rejections (written on first read)."""
        return self.explanation.resolve()[0]

    @property
    def rejected(self) -> tuple[Rejection, ...]:
        """A few candidates that failed, each with the first constraint it failed and why."""
        return self.explanation.resolve()[1]


@dataclass(frozen=True, slots=True)
class NoPlacement:
    binding: Constraint
    message: str
    stale: bool
    snapshot_version: int
    reasons: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    feasible: bool = False


@dataclass(frozen=True, slots=True)
class RebalanceReport:
    host: str
    sessions_released: tuple[str, ...]
    placements_released: int
