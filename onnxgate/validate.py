"""`policyc validate`: the CI gate against contract drift.

Steps, each failing with a verdict rather than an exception: read the model (graph only),
read and verify the embedded contract, count the FLOPs of one request at the contract's
token count, compare with the declared interval widened by the tolerance, and optionally
execute the model to check the count. A model passes when
`lo * (1 - tolerance) <= counted <= hi * (1 + tolerance)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from policyc.compiler.bundle import Contract

from .contract_metadata import contract_from_model
from .count import FlopCount, count_flops
from .errors import ContractMetadataError, CountError, ModelFileError
from .model_file import ModelSource, read_model, read_model_with_weights, source_name
from .runtime_check import RUN_TOKENS, RuntimeCheck, RuntimeCheckError, run_check

DEFAULT_TOLERANCE = 0.15


class Verdict(StrEnum):
    PASS = "pass"
    DRIFT = "drift"  # counted FLOPs outside the declared interval beyond the tolerance
    BAD_MODEL = "bad_model"  # not a readable ONNX model
    BAD_CONTRACT = "bad_contract"  # missing, corrupted or incomplete embedded contract
    UNCOUNTABLE = "uncountable"  # a compute node without a rule or without shapes
    RUN_MISMATCH = "run_mismatch"  # `--run`: executed nodes recount differently
    RUN_FAILED = "run_failed"  # `--run`: onnxruntime could not execute the model


@dataclass(frozen=True, slots=True)
class OpShare:
    op: str
    flops: int
    share: float


@dataclass(frozen=True, slots=True)
class ValidationReport:
    model: str
    verdict: Verdict
    message: str
    tolerance: float
    contract: Contract | None = None
    counted: int | None = None
    declared_lo: float | None = None
    declared_hi: float | None = None
    dominant: tuple[OpShare, ...] = ()
    problems: tuple[str, ...] = ()
    field: str | None = None  # the contract field at fault (bad_contract)
    run: RuntimeCheck | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.PASS

    @property
    def deviation(self) -> float | None:
        """Relative distance outside the declared interval (0 inside it)."""
        if self.counted is None or self.declared_lo is None or self.declared_hi is None:
            return None
        if self.counted < self.declared_lo:
            return (self.counted - self.declared_lo) / self.declared_lo
        if self.counted > self.declared_hi:
            return (self.counted - self.declared_hi) / self.declared_hi
        return 0.0


def _dominant(count: FlopCount, k: int = 5) -> tuple[OpShare, ...]:
    total = count.total() or 1
    return tuple(OpShare(op, f, f / total) for op, f in count.by_op_type()[:k])


def within(counted: float, lo: float, hi: float, tolerance: float) -> bool:
    return lo * (1 - tolerance) <= counted <= hi * (1 + tolerance)


def validate_model(
    source: ModelSource, *, tolerance: float = DEFAULT_TOLERANCE, run: bool = False,
    dims: Mapping[str, int] | None = None, run_tokens: int = RUN_TOKENS,
) -> ValidationReport:
    """Validate one model against its embedded contract; never raises for bad input."""
    name = source_name(source)
    try:
        model = read_model(source)
    except ModelFileError as e:
        return ValidationReport(name, Verdict.BAD_MODEL, str(e), tolerance)
    try:
        contract = contract_from_model(model, name)
    except ContractMetadataError as e:
        return ValidationReport(name, Verdict.BAD_CONTRACT, str(e), tolerance, field=e.field)
    declared = contract.compute.request_flops()
    # what is known so far; each verdict below is this report with its own verdict and message
    known = ValidationReport(name, Verdict.PASS, "", tolerance, contract=contract, declared_lo=declared.lo,
                             declared_hi=declared.hi)
    try:
        count = count_flops(model, contract.compute.tokens, dims=dims)
    except CountError as e:
        return replace(known, verdict=Verdict.UNCOUNTABLE, message=str(e), problems=e.problems)
    counted = count.total()
    dominant = _dominant(count)
    known = replace(known, counted=counted, dominant=dominant)
    check: RuntimeCheck | None = None
    if run:
        try:
            full = read_model_with_weights(source) if not isinstance(source, bytes) else model
            check = run_check(full, tokens=run_tokens, dims=dims)
        except (RuntimeCheckError, ModelFileError, CountError) as e:
            return replace(known, verdict=Verdict.RUN_FAILED, message=f"{name}: --run: {e}")
        if not check.ok:
            why = "; ".join(
                [f"node `{m.node}` ({m.op_type}): static {m.static:,} vs executed "
                 f"{'not executed' if m.executed is None else f'{m.executed:,}'}" for m in check.mismatches[:5]]
                + list(check.problems[:5])
            )
            return replace(
                known, verdict=Verdict.RUN_MISMATCH,
                message=f"{name}: executed nodes recount to {check.executed_flops:,} FLOPs at {check.tokens} tokens, "
                        f"the static count gives {check.static_flops:,}: {why}",
                run=check,
            )
    rng = f"{declared.lo:.4g}" if declared.lo == declared.hi else f"{declared.lo:.4g}..{declared.hi:.4g}"
    unit = f"FLOPs per request at {contract.compute.tokens} tokens"
    if within(counted, declared.lo, declared.hi, tolerance):
        return replace(
            known, message=f"{name}: contract `{contract.name}` holds: counted {counted:.4g} {unit}, declared {rng}",
            run=check,
        )
    report = replace(known, verdict=Verdict.DRIFT, run=check)
    msg = (f"{name}: contract drift in `{contract.name}`: counted {counted:.4g} {unit}, declared {rng} "
           f"({report.deviation:+.1%} outside the interval, tolerance {tolerance:.0%})")
    return replace(report, message=msg)
