"""What a contract means: the facts every stage reads, worked out in one place.

A contract's FLOPs per request, the instance attributes it fixes, the GPU share a request
needs on a GPU class within a latency window, the seconds its compute takes on a share of
a GPU, and the request variable that is the latency target: the compiler stores these in
the bundle (`Contract.gpu_shares`, `Bundle.latency_targets`) and every other stage (solver,
matcher, placer, audit, server) reads them there or calls this module, so there is one
formula for each and the stages cannot drift apart.

Standard library only, and it reads the bundle's models through the small read-only
protocols below, so that `dsl/` tooling and the runtime may both import it.

The share semantics, once:

    window          = slo.latency - slo.allowance            (none without an SLO)
    compute share   = flops_hi / (peak(precision) * efficiency * window)
    bandwidth share = bandwidth_min / hbm_bandwidth
    min share       = max(compute share, bandwidth share), feasible when <= 1

A contract without an SLO has no window: only its bandwidth bounds the share (a request's
own latency budget is checked against the latency the placer predicts, not reserved).
"""

from __future__ import annotations

import difflib
import enum
import math
from dataclasses import dataclass
from collections.abc import Iterable, Mapping
from typing import Protocol, Self, TypeVar

Scalar = bool | float | str

MIN_SHARE = 1e-6  # the least share of a GPU a request is ever computed on (no division by zero)
LATENCY_ATTRIBUTE = "slo_latency"  # the instance attribute a request's latency target bounds
LABEL_PREFIX = "labels."


class Cmp(enum.StrEnum):
    """A comparison in a rule or a guard; the value is how the bundle writes it."""

    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    IN = "in"
    NOT_IN = "not_in"


NEGATIVE_CMPS = frozenset({Cmp.NE, Cmp.NOT_IN})  # true when the attribute is absent


class ValueKind(enum.StrEnum):
    """The type of a request variable or an instance attribute."""

    TIME = "time"
    BANDWIDTH = "bandwidth"
    FLOPS = "flops"
    RATIO = "ratio"
    COUNT = "count"
    SIZE = "size"
    NAME = "name"
    STRING = "string"
    BOOL = "bool"


QUANTITY_KINDS: frozenset[str] = frozenset(
    {ValueKind.TIME, ValueKind.BANDWIDTH, ValueKind.FLOPS, ValueKind.RATIO, ValueKind.COUNT, ValueKind.SIZE}
)


class Binding(enum.StrEnum):
    """What decided a GPU share: the larger term, or the first hard mismatch."""

    COMPUTE = "compute"
    BANDWIDTH = "bandwidth"
    ARCHITECTURE = "architecture"
    PRECISION = "precision"
    SLO = "slo"


# ----------------------------------------------------------------------- what we read


class IntervalView(Protocol):
    @property
    def lo(self) -> float: ...
    @property
    def hi(self) -> float: ...


class ComputeView(Protocol):
    @property
    def flops(self) -> IntervalView: ...
    @property
    def per(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def efficiency(self) -> float: ...


class MemoryView(Protocol):
    @property
    def bandwidth_min(self) -> float: ...


class SloView(Protocol):
    @property
    def latency(self) -> float: ...
    @property
    def allowance(self) -> float: ...


class ContractView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def compute(self) -> ComputeView: ...
    @property
    def memory(self) -> MemoryView: ...
    @property
    def slo(self) -> SloView | None: ...
    @property
    def gpu_arch(self) -> tuple[str, ...]: ...
    @property
    def labels(self) -> tuple[tuple[str, str], ...]: ...


class GpuView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def arch(self) -> str: ...
    @property
    def hbm_bandwidth(self) -> float: ...
    def peak(self, precision: str) -> float | None: ...


# ----------------------------------------------------------------------- FLOPs and time


@dataclass(frozen=True, slots=True)
class Flops:
    """FLOPs of one request at the contract's token count."""

    lo: float
    hi: float


def request_flops(compute: ComputeView) -> Flops:
    """FLOPs per request: per-token figures times the contract's token count."""
    k = compute.tokens if compute.per == "token" else 1
    return Flops(compute.flops.lo * k, compute.flops.hi * k)


def latency_window(slo: SloView | None) -> float | None:
    """The seconds left for compute: the SLO less its network/queueing allowance."""
    return None if slo is None else slo.latency - slo.allowance


def compute_rate(compute: ComputeView, gpu: GpuView) -> float | None:
    """FLOP/s a whole GPU of this class gives the model (its peak at the contract's
    precision times the contract's efficiency); None when the class has no such peak."""
    peak = gpu.peak(compute.precision)
    return None if peak is None else peak * compute.efficiency


class Elementwise(Protocol):
    """A float or an array of them (the placer passes numpy arrays)."""

    def __mul__(self, other: Self, /) -> Self: ...
    def __rtruediv__(self, other: float, /) -> Self: ...


_E = TypeVar("_E", bound=Elementwise)


def compute_seconds(flops: float, rate: _E, share: _E) -> _E:
    """Seconds `flops` take at `rate` FLOP/s on `share` of the GPU (elementwise for arrays;
    the caller keeps `share` at least MIN_SHARE)."""
    return flops / (rate * share)


# ----------------------------------------------------------------------- GPU share


@dataclass(frozen=True, slots=True)
class Share:
    """The least share of one GPU class a request of the contract needs, and why."""

    gpu: str
    feasible: bool
    min_share: float | None  # in (0, 1] when feasible
    binding: Binding
    detail: str


def contract_share(contract: ContractView, gpu: GpuView) -> Share:
    """The share a request of the contract needs on `gpu` within the contract's own window:
    what the bundle stores and the placer reserves."""
    return gpu_share(contract, gpu, latency_window(contract.slo))


def gpu_share(contract: ContractView, gpu: GpuView, window: float | None) -> Share:
    """The share semantics of this module's docstring for a latency window in seconds
    (None: no window, only the bandwidth bounds the share)."""
    c = contract.compute
    if contract.gpu_arch and gpu.arch not in contract.gpu_arch:
        return Share(gpu.name, False, None, Binding.ARCHITECTURE,
                     f"{gpu.arch} is not among the contract's architectures ({', '.join(contract.gpu_arch)})")
    rate = compute_rate(c, gpu)
    if rate is None:
        return Share(gpu.name, False, None, Binding.PRECISION, f"{gpu.name} has no {c.precision} peak in the catalog")
    bandwidth = contract.memory.bandwidth_min
    bw_share = bandwidth / gpu.hbm_bandwidth
    if bw_share > 1:
        return Share(gpu.name, False, None, Binding.BANDWIDTH,
                     f"needs {bandwidth / 1e9:g} GB/s, {gpu.name} offers {gpu.hbm_bandwidth / 1e9:g} GB/s")
    flops_hi = request_flops(c).hi
    if window is None:
        return Share(gpu.name, True, bw_share, Binding.BANDWIDTH, "no SLO: only the bandwidth need bounds the share")
    if window <= 0:
        return Share(gpu.name, False, None, Binding.SLO, "the network/queueing allowance consumes the whole SLO")
    compute_share = flops_hi / (rate * window)
    if compute_share > 1:
        fastest = flops_hi / rate
        return Share(gpu.name, False, None, Binding.COMPUTE,
                     f"{flops_hi:.3g} FLOPs take {fastest * 1e3:.1f} ms on a whole {gpu.name}, "
                     f"over the {window * 1e3:g} ms compute budget")
    if compute_share >= bw_share:
        peak = rate / c.efficiency
        return Share(gpu.name, True, compute_share, Binding.COMPUTE,
                     f"{flops_hi:.3g} FLOPs in {window * 1e3:g} ms at {c.efficiency:.0%} of {peak / 1e12:g} TFLOP/s")
    return Share(gpu.name, True, bw_share, Binding.BANDWIDTH,
                 f"{bandwidth / 1e9:g} of {gpu.hbm_bandwidth / 1e9:g} GB/s")


# ----------------------------------------------------------------------- attributes

# The instance attributes a contract fixes (one value per contract, whatever the deployment).
CONTRACT_ATTRIBUTES: tuple[str, ...] = ("model", "version", "slo_latency", "flops_min", "flops_max", "bandwidth")
# The quantities among them (the rest are names).
CONTRACT_QUANTITIES: tuple[str, ...] = ("slo_latency", "flops_min", "flops_max", "bandwidth")


def fixed_attributes(contract: ContractView) -> dict[str, Scalar]:
    """The CONTRACT_ATTRIBUTES of the contract, in SI units. `slo_latency` is infinite
    without an SLO: every `slo_latency <= x` is then false."""
    flops = request_flops(contract.compute)
    return {
        "model": contract.name,
        "version": contract.version,
        "slo_latency": contract.slo.latency if contract.slo is not None else math.inf,
        "flops_min": flops.lo,
        "flops_max": flops.hi,
        "bandwidth": contract.memory.bandwidth_min,
    }


def fixed_quantity(contract: ContractView, attr: str) -> float:
    """One of CONTRACT_QUANTITIES for the contract."""
    if attr not in CONTRACT_QUANTITIES:
        raise ValueError(f"`{attr}` is not a quantity the contract fixes ({', '.join(CONTRACT_QUANTITIES)})")
    value = fixed_attributes(contract)[attr]
    if isinstance(value, str):
        raise TypeError(f"`{attr}` is a name, not a quantity")
    return float(value)


def contract_attributes(contract: ContractView) -> dict[str, Scalar]:
    """The attributes the contract fixes, its labels included (`labels.<k>`)."""
    attrs = fixed_attributes(contract)
    for k, v in contract.labels:
        attrs[LABEL_PREFIX + k] = v
    return attrs


def instance_attributes(contract: ContractView, deployment: Mapping[str, Scalar],
                        labels: Mapping[str, str] | None = None) -> dict[str, Scalar]:
    """What request rules see of a running instance: the contract's attributes and the
    deployment's facts (region, gpu_model, gpu_arch, host, the security flags, numa_node
    as a float, session_state), then the instance's own labels, which win over the
    contract's."""
    fixed = contract_attributes(contract)
    attrs: dict[str, Scalar] = {"model": fixed.pop("model"), "version": fixed.pop("version")}
    attrs.update(deployment)
    attrs.update(fixed)
    for k, v in (labels or {}).items():
        attrs[LABEL_PREFIX + k] = v
    return attrs


# ----------------------------------------------------------------------- an LLM request


class LlmView(Protocol):
    @property
    def prefill_flops(self) -> float: ...
    @property
    def decode_flops(self) -> float: ...
    @property
    def context(self) -> int: ...
    @property
    def kv_bytes_per_token(self) -> float | None: ...
    @property
    def ttft(self) -> float | None: ...
    @property
    def tpot(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class LlmCost:
    """One LLM request's cost, from its own prompt and output tokens (the output is its
    `max_tokens`: the most it may generate, so the estimate is an upper bound)."""

    flops: float  # prefill + decode FLOPs
    ttft_s: float  # the prefill's compute time on the share: the first token's lower bound
    total_s: float  # prefill and every output token
    kv_bytes: float | None  # KV cache the request holds at its end (None: not declared)


def llm_cost(llm: LlmView, prompt_tokens: float, output_tokens: float, rate: float, share: float = 1.0) -> LlmCost:
    """What a request of `prompt_tokens` in and `output_tokens` out costs on a GPU whose
    effective FLOP/s is `rate` (`compute_rate`), computed on `share` of it:

        prefill = prefill_flops * prompt_tokens      ttft  = prefill / (rate * share)
        decode  = decode_flops * output_tokens       total = (prefill + decode) / (rate * share)
        kv      = kv_bytes_per_token * (prompt_tokens + output_tokens)
    """
    prefill = llm.prefill_flops * max(prompt_tokens, 0.0)
    decode = llm.decode_flops * max(output_tokens, 0.0)
    speed = rate * max(share, MIN_SHARE)
    kv = llm.kv_bytes_per_token * (prompt_tokens + output_tokens) if llm.kv_bytes_per_token is not None else None
    return LlmCost(prefill + decode, prefill / speed if speed > 0 else math.inf,
                   (prefill + decode) / speed if speed > 0 else math.inf, kv)


def llm_budget(llm: LlmView, output_tokens: float, ttft: float | None = None, tpot: float | None = None) -> float | None:
    """A request's whole-answer budget from its token SLOs (a request's own `ttft` / `tpot`,
    else the contract's): `ttft + tpot * (output_tokens - 1)`; None without both."""
    first = ttft if ttft is not None else llm.ttft
    per = tpot if tpot is not None else llm.tpot
    if first is None or per is None:
        return None
    return first + per * max(output_tokens - 1.0, 0.0)


# ----------------------------------------------------------------------- latency target


def latency_targets(comparisons: Iterable[tuple[str, str, str | None]]) -> tuple[str, ...]:
    """The request variables that are a request's latency target: those a rule compares
    the instance's `slo_latency` with as an upper bound (`slo_latency <= request.X`, `<`,
    `==`). `comparisons` are (attribute, comparison, request variable or None for a
    constant) for every comparison in the rules' requirements."""
    upper = {Cmp.LT, Cmp.LE, Cmp.EQ}
    return tuple(sorted({var for attr, cmp, var in comparisons
                         if attr == LATENCY_ATTRIBUTE and var is not None and cmp in upper}))


# ----------------------------------------------------------------------- names


def did_you_mean(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The closest known name to a misspelt one, when one is close enough."""
    best = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return best[0] if best else None
