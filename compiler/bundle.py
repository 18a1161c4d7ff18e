"""The bundle: the one artifact between compile time and run time.

Everything the runtime (matcher, placer, server, enforcer, audit) knows about policy comes
from here, never from `.contract` source. The models are the versioned schema of that
artifact *and* the compiler's lowered IR: keeping one definition avoids a second,
drifting copy of the same shapes. Quantities are SI floats (seconds, bytes/s, FLOPs,
fractions in [0, 1]); every entity keeps the `SourceRef` it came from so that solver
verdicts, decisions and audit records can point at `file:line:col`.

Canonical form: `canonical_bytes()` is compact JSON (msgspec) with sorted keys over everything but
`content_hash` and `signature`; its sha256 is the content hash. Loading verifies the
schema version and the hash (see `compiler/bundle_io.py`).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from . import meaning
from .diagnostic import Diagnostic, Span

SCHEMA_VERSION = "policyc.bundle/v4"  # v2: canonical bytes written by orjson; v3: full spans, latency targets, one Diagnostic;
# v4: canonical bytes written by msgspec (a float's exponent without `+`: 1e16, not 1e+16)

Cmp = meaning.Cmp  # an enum of the comparisons, written in the bundle as "==", "<=", "in", ...
ValueType = Literal["time", "bandwidth", "flops", "ratio", "count", "size", "name", "string", "bool"]
SecurityAttr = Literal["tpm", "memory_encryption", "hardware_firewall", "tee"]
SECURITY_ATTRS: tuple[str, ...] = ("tpm", "memory_encryption", "hardware_firewall", "tee")
Scalar = Union[bool, float, str]
OnMissing = Literal["reject", "ignore", "default"]
OnMalformed = Literal["reject", "ignore"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceRef(Frozen):
    """Where a bundle entity came from, the whole span; `file` is relative to the compile
    root. The serialised form of a `Span` (`of` and `span` convert, losing nothing); an
    end of 0 means a point (a reference written by hand, e.g. in a test)."""

    file: str
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @classmethod
    def of(cls, span: Span) -> SourceRef:
        return cls(file=span.file, line=span.line, col=span.col, end_line=span.end_line, end_col=span.end_col)

    def span(self) -> Span:
        if self.end_line <= 0:
            return Span.point(self.file, self.line, self.col)
        return Span(self.file, self.line, self.col, self.end_line, self.end_col)


# --------------------------------------------------------------------------- contracts


class Interval(Frozen):
    lo: float
    hi: float


class Compute(Frozen):
    """FLOPs per request at `tokens` tokens (or per token); efficiency is the share of the
    GPU's peak the model reaches, used for SLO-aware GPU-share bounds."""

    flops: Interval
    per: Literal["request", "token"]
    tokens: int
    precision: str = "fp16"
    efficiency: float = 0.5

    def request_flops(self) -> Interval:
        """FLOPs of one request at the contract's token count (`meaning.request_flops`)."""
        f = meaning.request_flops(self)
        return Interval(lo=f.lo, hi=f.hi)


class Memory(Frozen):
    bandwidth_min: float  # bytes/s sustained
    burst_max: float  # seconds


class VersionBound(Frozen):
    op: Literal["<", "<=", ">", ">=", "=="]
    version: str


class ServiceDependency(Frozen):
    name: str
    kind: str  # redis, postgres, http, grpc, s3, ...
    p99: float  # seconds
    proxy: Literal["none", "shared", "dedicated"] = "none"
    origin: SourceRef


class Dependencies(Frozen):
    services: tuple[ServiceDependency, ...] = ()
    async_callbacks: bool = False
    cuda: tuple[VersionBound, ...] = ()
    libraries: tuple[str, ...] = ()


class Slo(Frozen):
    latency: float  # seconds, upper bound
    allowance: float = 0.0  # seconds of network + queueing reserved out of `latency`


class Llm(Frozen):
    """An LLM's per-token costs, limits and token SLOs (`llm { … }`), in SI units: what a
    request costs is its own prompt and `max_tokens` times these (`meaning.llm_*`)."""

    prefill_flops: float  # FLOPs per prompt token
    decode_flops: float  # FLOPs per output token
    context: int  # tokens: prompt and output together
    kv_bytes_per_token: float | None = None  # bytes of KV cache a token holds
    ttft: float | None = None  # seconds: time to first token, upper bound
    tpot: float | None = None  # seconds: time per output token after the first, upper bound


class Session(Frozen):
    state: Literal["nvme", "host_memory", "remote"]
    colocate: Literal["same_numa", "same_host", "none"] = "none"


class GpuShare(Frozen):
    """The solver's SLO-aware lower bound on the share of one GPU class a request needs.

    `min_share` is in (0, 1] when feasible; `binding` names the constraint that decided
    (compute, bandwidth, memory, architecture, slo) so an operator sees why.
    """

    gpu: str
    feasible: bool
    min_share: float | None = None
    binding: str
    detail: str


class Contract(Frozen):
    name: str
    version: str
    compute: Compute
    memory: Memory
    dependencies: Dependencies
    slo: Slo | None = None
    regions: tuple[str, ...] = ()  # allowed data regions (empty: any)
    gpu_arch: tuple[str, ...] = ()  # allowed architectures (empty: any)
    security: tuple[SecurityAttr, ...] = ()  # attributes the deployment must provide
    session: Session | None = None
    labels: tuple[tuple[str, str], ...] = ()
    llm: Llm | None = None  # an LLM's per-token contract (absent for other models)
    origin: SourceRef
    field_origins: tuple[tuple[str, SourceRef], ...] = ()  # "compute.flops" -> span
    gpu_shares: tuple[GpuShare, ...] = ()  # filled by the solver

    def span_of(self, field: str) -> SourceRef:
        """The span of a field such as `compute.flops`, or the contract's own span."""
        for name, ref in self.field_origins:
            if name == field:
                return ref
        return self.origin


# --------------------------------------------------------------------------- GPU catalog


class GpuClass(Frozen):
    name: str  # A100-80G, H100, L4, ...
    arch: str  # ampere, hopper, ada, ...
    peak_flops: tuple[tuple[str, float], ...]  # precision -> FLOP/s (dense)
    hbm_bandwidth: float  # bytes/s
    memory: float  # bytes
    origin: SourceRef

    def peak(self, precision: str) -> float | None:
        for p, v in self.peak_flops:
            if p == precision:
                return v
        return None


# --------------------------------------------------------------------------- requests


class HeaderMapping(Frozen):
    """How one request header becomes a typed request variable, and what a missing or
    malformed value means (declared by the author, never implicit)."""

    header: str  # as written, matched case-insensitively
    var: str
    type: ValueType
    range: Interval | None = None  # allowed range for quantities, SI
    values: tuple[str, ...] = ()  # allowed names (empty: any well-formed name)
    on_missing: OnMissing
    default: Scalar | None = None
    on_malformed: OnMalformed = "reject"
    origin: SourceRef


class Tenant(Frozen):
    name: str
    tenant_class: str
    origin: SourceRef


class Const(Frozen):
    kind: Literal["const"] = "const"
    value: Scalar | tuple[Scalar, ...]


class Var(Frozen):
    """A request variable (from a header mapping, or `tenant` / `tenant_class`)."""

    kind: Literal["var"] = "var"
    name: str


Operand = Annotated[Union[Const, Var], Field(discriminator="kind")]


class Atom(Frozen):
    """`instance.attr cmp operand`: the unit the matcher indexes."""

    op: Literal["atom"] = "atom"
    attr: str
    cmp: Cmp
    operand: Operand
    origin: SourceRef


class Test(Frozen):
    """`request.var cmp const` (or presence when cmp is None): guards over the request."""

    op: Literal["test"] = "test"
    var: str
    cmp: Cmp | None = None
    operand: Const | None = None
    origin: SourceRef


class And(Frozen):
    op: Literal["and"] = "and"
    args: tuple["Expr", ...]


class Or(Frozen):
    op: Literal["or"] = "or"
    args: tuple["Expr", ...]


class Not(Frozen):
    op: Literal["not"] = "not"
    arg: "Expr"


Expr = Annotated[Union[Atom, Test, And, Or, Not], Field(discriminator="op")]


class RequestRule(Frozen):
    """When `guard` holds for the request, every admitted instance must satisfy `require`."""

    id: str  # "<policy>.<rule>"
    policy: str
    guard: Expr | None = None
    require: Expr
    origin: SourceRef


class IndexedAttribute(Frozen):
    """The index plan for one instance attribute."""

    attr: str
    kind: Literal["equality", "set", "range", "boolean"]
    type: ValueType
    fed_by: tuple[str, ...] = ()  # headers whose values reach this attribute
    used_by: tuple[str, ...] = ()  # rule ids


# --------------------------------------------------------------------------- circuit breakers


class SignalCondition(Frozen):
    """`signal cmp value`; with `of`, value is a fraction of that quantity: the contract's
    SLO (elapsed >= 0.925 of slo) or the latency the request's placement predicted
    (elapsed >= 3.0 of predicted)."""

    signal: str
    cmp: Literal["<", "<=", ">", ">="]
    value: float
    of: Literal["slo", "predicted"] | None = None
    origin: SourceRef


class CancelStream(Frozen):
    kind: Literal["cancel_stream"] = "cancel_stream"


class Redirect(Frozen):
    kind: Literal["redirect"] = "redirect"
    backup: str  # contract name of the backup model
    variant: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


class Quarantine(Frozen):
    kind: Literal["quarantine"] = "quarantine"
    duration: float  # seconds, doubled on each repeat up to max_duration
    max_duration: float
    max_share: float  # at most this fraction of backends quarantined at once


class ReportAnomaly(Frozen):
    kind: Literal["report_anomaly"] = "report_anomaly"


class SelfHeal(Frozen):
    kind: Literal["self_heal"] = "self_heal"
    steps: tuple[Literal["gpu_reset", "rdma_link_refresh", "rebalance"], ...]


Action = Annotated[
    Union[CancelStream, Redirect, Quarantine, ReportAnomaly, SelfHeal], Field(discriminator="kind")
]


class Breaker(Frozen):
    """One circuit-break rule as a table row: all conditions must hold `consecutive`
    times in a row within `scope`, then the actions run in order."""

    name: str
    scope: Literal["request", "gpu", "backend", "connection"]
    models: tuple[str, ...] = ()  # empty: every contract
    conditions: tuple[SignalCondition, ...]
    consecutive: int = 1
    classify: str | None = None  # e.g. client_network, model_fault
    retry_budget: float = 0.2  # retries never exceed this share of active requests
    actions: tuple[Action, ...]
    origin: SourceRef


# --------------------------------------------------------------------------- the bundle


class Signature(Frozen):
    alg: Literal["ed25519"] = "ed25519"
    public_key: str  # hex, for identification; verification uses the caller's key
    value: str  # hex signature over the content hash


class Bundle(Frozen):
    schema_version: Literal["policyc.bundle/v4"] = "policyc.bundle/v4"  # SCHEMA_VERSION
    compiler_version: str
    contracts: tuple[Contract, ...] = ()
    gpu_catalog: tuple[GpuClass, ...] = ()
    headers: tuple[HeaderMapping, ...] = ()
    tenants: tuple[Tenant, ...] = ()
    rules: tuple[RequestRule, ...] = ()
    index_plan: tuple[IndexedAttribute, ...] = ()
    breakers: tuple[Breaker, ...] = ()
    latency_targets: tuple[str, ...] = ()  # request variables that bound `slo_latency` (meaning.latency_targets)
    warnings: tuple[Diagnostic, ...] = ()  # warnings the compiler kept (e.g. a shadowed rule), shown without the source
    content_hash: str = ""
    signature: Signature | None = None

    def contract(self, name: str) -> Contract | None:
        """The contract of that name (the first, as a scan would find): a dict look-up, so
        a registry build asking once per deployment signature stays linear in the fleet."""
        return _named(self, "_contract_names", self.contracts).get(name)

    def gpu(self, name: str) -> GpuClass | None:
        return _named(self, "_gpu_names", self.gpu_catalog).get(name)


def _named(bundle: Bundle, slot: str, items: tuple) -> dict:
    """name -> first item of that name, built once per `items` tuple and kept in the
    instance's `__dict__` beside the fields (pydantic compares and dumps fields only). The
    tuple is checked by identity, so a `model_copy(update=...)` with new items, which copies
    `__dict__`, never reads a stale table."""
    hit = bundle.__dict__.get(slot)
    if hit is None or hit[0] is not items:
        table: dict = {}
        for it in items:
            table.setdefault(it.name, it)
        hit = bundle.__dict__[slot] = (items, table)
    return hit[1]
