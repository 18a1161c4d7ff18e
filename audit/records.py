"""The audit record schemas: the versioned contract between the decision service, the
enforcer and auditors.

A record is what an auditor gets for one model call (`DecisionRecord`) or one enforcement /
self-heal step (`ActionRecord`). Records are frozen pydantic models because they cross an
edge: they are serialised once, hashed into the chain, and read back years later by a
different policyc. Every resource figure says its kind, in `source`: *measured* (by a
party other than the one billed: NVML, Envoy's access log, kernel per-flow counters),
*apportioned* (a measured total, e.g. a serving process's cgroup CPU time, divided across
the calls it served by a stated rule) or *estimated* (from the contract and placement), and
what produced it, in `method`; auditors accept the three as different kinds of evidence.

Times are UTC Unix seconds (floats); durations are seconds; sizes are bytes.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from policyc.compiler.bundle import SourceRef

from .schemas import ACTION_SCHEMA, DECISION_SCHEMA


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(str, Enum):
    """The kind of a resource figure (its source is its `method`)."""

    MEASURED = "measured"
    APPORTIONED = "apportioned"  # a measured total divided across calls; `method` states the rule
    ESTIMATED = "estimated"


class Figure(_Frozen):
    """One resource quantity with its provenance: `source` is its kind (measured /
    apportioned / estimated), `method` what produced it (`nvml`, `kernel_flow_counters`,
    `contract_flops/peak`, and for an apportioned figure the rule that divided it) so an
    auditor can weigh it; `low`/`high` bound an estimate when the contract gives a range."""

    value: float = Field(ge=0)
    source: Source
    method: str
    low: float | None = None
    high: float | None = None


class LlmFigures(_Frozen):
    """An LLM call's own figures: its tokens, the time to its first token and per output
    token measured at the gateway, and the contract's budgets and FLOPs beside them
    (`estimated`). Each figure says its source and method."""

    prompt_tokens: Figure | None = None
    completion_tokens: Figure | None = None
    ttft_seconds: Figure | None = None
    tpot_seconds: Figure | None = None
    ttft_budget_seconds: Figure | None = None
    tpot_budget_seconds: Figure | None = None
    flops: Figure | None = None
    ttft_estimated_seconds: Figure | None = None  # the contract's FLOPs at the placed GPU class's rate
    total_estimated_seconds: Figure | None = None


class Resources(_Frozen):
    """What one call consumed. A figure is None only when nothing could measure or estimate
    it (e.g. network bytes with no enforcer and no payload sizes): absent, never invented.

    `compute_seconds` is the model server's own time computing the call, on whatever device
    it ran (an `accounting` record's, from the model server); `gpu_seconds` is GPU time only
    (NVML, or the contract's estimate), never CPU time. `compute_seconds` came after the
    first records were written: a record without it reads as before and its body, so its
    hash, is unchanged (bodies omit absent figures). The record schema id stays v1, because
    store-v1 logs, still appended to, classify entries by that exact id in their table
    definition; `LEGACY_COMPUTE_METHOD` in `query.py` says how older `accounting` records,
    which carried the compute time as `gpu_seconds`, are read."""

    gpu_seconds: Figure | None = None  # GPU-equivalent seconds (share x wall time)
    memory_bytes: Figure | None = None  # bytes moved over GPU memory (HBM)
    network_bytes: Figure | None = None  # bytes on the wire, both directions
    compute_seconds: Figure | None = None  # the model server's measured compute time (CPU or GPU), every attempt
    # New figures (the LLM path's token counts, ...) go here as `Figure | None = None` (and in
    # `draft_encoder.ResourcesWire`, same order): absent ones are left out of a body, so older
    # records keep their bytes and hashes, and `export` gives each new figure its columns.


class MatchedRule(_Frozen):
    """A request rule that applied to the decision, with where it was written."""

    id: str  # "<policy>.<rule>" as in the bundle
    origin: SourceRef

    def where(self) -> str:
        return f"{self.origin.file}:{self.origin.line}"


class RejectingRule(_Frozen):
    """What refused a rejected decision (`server/rejected_by.py` says what each rejection
    kind gives): a rule of the bundle (`id` as in the bundle, `origin` where it was
    written) or, where no rule did, the stage's own cause (`id` the stage's name, or
    `placement:<binding constraint>`), with the declaration that refused it when there is one."""

    stage: Literal["feasibility", "match", "placement"]
    id: str
    origin: SourceRef | None = None

    def where(self) -> str:
        return f"{self.origin.file}:{self.origin.line}" if self.origin is not None else ""


class Placement(_Frozen):
    """Where the call was placed (None fields: not decided, e.g. for a rejection)."""

    instance: str | None = None
    host: str | None = None
    gpu: str | None = None
    gpu_model: str | None = None
    region: str | None = None
    share: float | None = Field(default=None, gt=0, le=1)  # fraction of the GPU reserved
    predicted_latency: float | None = None  # seconds


class Latency(_Frozen):
    """How long the decision took, in seconds, by stage (e.g. match, place, solve)."""

    total: float = Field(ge=0)
    stages: dict[str, float] = Field(default_factory=dict)


Outcome = Literal["admitted", "rejected", "failed"]


class DecisionRecord(_Frozen):
    """One model call's decision: what was decided, under which bundle, why, what it cost.

    `request` holds the request's headers and typed variables; the log redacts configured
    header names (and any copy of their values anywhere in the record) before hashing.
    """

    schema_version: Literal["policyc.audit.decision/v1"] = DECISION_SCHEMA
    time: float
    decision_id: str = Field(min_length=1)
    tenant: str
    model: str | None = None  # contract name the request asked for or was matched to
    request: dict[str, str] = Field(default_factory=dict)  # headers, after redaction
    variables: dict[str, str | float | bool] = Field(default_factory=dict)
    bundle_hash: str
    outcome: Outcome
    reason: str | None = None  # one line, for rejections and failures
    matched_rules: tuple[MatchedRule, ...] = ()
    # a rejection's refusing rules, each with its source: absent from older records' and
    # admitted records' bodies, so their bytes and hashes hold
    rejected_by: tuple[RejectingRule, ...] | None = None
    placement: Placement | None = None
    latency: Latency
    resources: Resources = Resources()


ActionKind = Literal[
    "cancel_stream",
    "redirect",
    "quarantine",
    "release",
    "report_anomaly",
    "gpu_reset",
    "rdma_link_refresh",
    "rebalance",
    "log_recovered",
    "bundle_reload",  # a bundle reload, accepted (outcome done) or refused (skipped), with why in the detail
    "accounting",  # what one call through the gateway consumed, measured (Envoy's access log, the model server)
]
ActionOutcome = Literal["done", "dry_run", "failed", "skipped"]


class ActionRecord(_Frozen):
    """One enforcement or self-heal step. Dangerous steps are dry-run by default; `dry_run`
    and `outcome` say which happened. `rule` names the breaker that fired (None for actions
    the system took on its own, such as recovering this log)."""

    schema_version: Literal["policyc.audit.action/v1"] = ACTION_SCHEMA
    time: float
    kind: ActionKind
    target: str  # gpu, backend, connection, stream or instance acted on
    rule: str | None = None
    rule_origin: SourceRef | None = None
    outcome: ActionOutcome
    dry_run: bool
    decision_id: str | None = None  # the call that triggered it, when there is one
    detail: str = ""
    resources: Resources | None = None  # `accounting`: the call's measured figures (absent from other kinds' bodies)
    llm: LlmFigures | None = None  # an LLM call's `accounting`: its tokens and token times (gateway/llm_stream.py)
    # a traced call's `accounting` (`policyc gateway --otlp-endpoint`): its W3C trace id, whose spans carry the
    # decision id in turn (gateway/tracing.py). Absent from other records' bodies, so their bytes and hashes hold
    trace_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")


class EntryKind(str, Enum):
    DECISION = "decision"
    ACTION = "action"


class Entry(_Frozen):
    """A record as stored in the chain: its position, its link and its own hash."""

    seq: int
    kind: EntryKind
    prev_hash: str  # hex
    hash: str  # hex
    record: DecisionRecord | ActionRecord
