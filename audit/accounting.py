"""Per-call resource accounting: what one model call consumed, and how we know.

Where something measured a quantity (NVML for GPU time, Envoy's access log for network
bytes, the model server for its compute time), the caller passes the figure in and it is
labelled `measured` with its source. Otherwise GPU time and memory traffic are estimated from the contract and the
placement: a request of F FLOPs on a GPU whose peak at the contract's precision is P, at the
contract's efficiency e, occupies F / (P * e) GPU-seconds; on a share s of the GPU it runs
for that divided by s; at the contract's sustained bandwidth B it moves B times that many
bytes. Estimates carry the low/high ends from the contract's FLOPs range.
Network bytes are never estimated: without a measurement the figure is absent.
"""

from __future__ import annotations

from typing import Literal

from policyc.compiler.bundle import Contract, GpuClass
from policyc.compiler.meaning import compute_rate, compute_seconds, request_flops

from .accounting_wire import accounting_json
from .draft_encoder import FigureWire
from .drafts import FigureFields
from .records import ActionRecord, Figure, Resources, Source


def measured(value: float, method: str) -> Figure:
    """A figure something measured (e.g. `measured(0.031, "nvml")`)."""
    return Figure(value=value, source=Source.MEASURED, method=method)


def estimate_resources(
    contract: Contract,
    gpu: GpuClass,
    share: float,
    *,
    tokens: int | None = None,
    gpu_seconds: Figure | None = None,
    memory_bytes: Figure | None = None,
    network_bytes: Figure | None = None,
) -> Resources:
    """Resources of one call of `contract` on `share` (0 < share <= 1) of a `gpu`.

    `tokens`: the call's token count when known (scales the contract's FLOPs, which are
    stated per request at the contract's token count, or per token). Figures passed in
    (measured) replace the corresponding estimate. A quantity that cannot be estimated
    (the GPU class lists no peak at the contract's precision) is absent, not guessed.
    """
    est = estimated_figures(contract, gpu, share, tokens=tokens)
    est_gpu, est_mem = est.get("gpu_seconds"), est.get("memory_bytes")
    return Resources(
        gpu_seconds=gpu_seconds if gpu_seconds is not None else (Figure.model_validate(est_gpu) if est_gpu else None),
        memory_bytes=memory_bytes if memory_bytes is not None else (Figure.model_validate(est_mem) if est_mem else None),
        network_bytes=network_bytes,
    )


def estimated_figures(contract: Contract, gpu: GpuClass, share: float, *, tokens: int | None = None) -> dict[str, FigureFields]:
    """The estimates of `estimate_resources` as plain values (the `resources` of a decision
    draft): no pydantic on the decision thread. Keys absent: not estimable."""
    if not 0 < share <= 1:
        raise ValueError(f"GPU share must be in (0, 1], got {share}")
    if tokens is not None and tokens <= 0:
        raise ValueError(f"token count must be positive, got {tokens}")
    c = contract.compute
    flops = request_flops(c)
    scale = 1.0
    if tokens is not None and c.tokens > 0:
        scale = tokens / c.tokens  # FLOPs grow linearly with tokens, per request or per token
    lo, hi = flops.lo * scale, flops.hi * scale
    rate = compute_rate(c, gpu)
    if rate is None or rate <= 0:
        return {}
    g_lo, g_hi = compute_seconds(lo, rate, 1.0), compute_seconds(hi, rate, 1.0)  # GPU-seconds: on a whole GPU
    bw = contract.memory.bandwidth_min
    estimated = Source.ESTIMATED.value
    return {
        "gpu_seconds": {
            "value": (g_lo + g_hi) / 2,
            "source": estimated,
            "method": f"contract FLOPs / ({gpu.name} peak {c.precision} x efficiency {c.efficiency:g})",
            "low": g_lo,
            "high": g_hi,
        },
        "memory_bytes": {
            "value": bw * (g_lo + g_hi) / 2 / share,
            "source": estimated,
            "method": f"contract bandwidth_min x estimated duration on a {share:g} share",
            "low": bw * g_lo / share,
            "high": bw * g_hi / share,
        },
    }


def call_accounting(
    decision_id: str,
    time: float,
    *,
    network_bytes: float,
    network_method: str,
    compute_seconds: float | None,
    compute_method: str,
    target: str,
    detail: str,
    gpu_seconds: Figure | None = None,
    compute_kind: Source = Source.MEASURED,
    trace_id: str | None = None,
) -> ActionRecord:
    """The `accounting` record of one call through the gateway, joined to its decision by
    `decision_id`: the bytes the data plane counted on the wire (both directions, every
    attempt) and the compute time the model server measured (`compute_seconds`, on whatever
    device it computed). `gpu_seconds` is GPU time only, from NVML, when the caller has it
    (per process, or labelled device-wide in its method); it is never the compute time. A
    figure nothing measured is absent, never estimated here (the decision record holds the
    estimates). `detail` carries the per-attempt breakdown (JSON). `compute_kind`:
    APPORTIONED when the compute time is a share of a measured total (the serving
    process's cgroup CPU time divided across the calls it served; `compute_method` then
    states the rule); an estimate is refused here, as for `gpu_seconds`."""
    _check(decision_id, network_bytes, compute_seconds)
    if gpu_seconds is not None and gpu_seconds.source is Source.ESTIMATED:
        raise ValueError(f"decision {decision_id}: an accounting record holds measured GPU time only (or apportioned from a "
                         f"measured total), got {gpu_seconds.source.value}")
    if compute_kind is Source.ESTIMATED:
        raise ValueError(f"decision {decision_id}: an accounting record holds measured or apportioned compute time, not an estimate")
    return ActionRecord(
        time=time, kind="accounting", target=target, outcome="done", dry_run=False, decision_id=decision_id,
        detail=detail,
        resources=Resources(
            network_bytes=measured(network_bytes, network_method),
            compute_seconds=Figure(value=compute_seconds, source=compute_kind, method=compute_method) if compute_seconds is not None else None,
            gpu_seconds=gpu_seconds,
        ),
        trace_id=trace_id,
    )


def _check(decision_id: str, network_bytes: float, compute_seconds: float | None) -> None:
    # `not x >= 0`: NaN is refused too, as the models' `ge=0` refuses it
    if not network_bytes >= 0 or (compute_seconds is not None and not compute_seconds >= 0):
        raise ValueError(f"decision {decision_id}: measured figures cannot be negative")


def call_accounting_body(
    decision_id: str,
    time: float,
    *,
    network_bytes: float,
    network_method: str,
    compute_seconds: float | None,
    compute_method: str,
    target: str,
    detail: str,
    compute_kind: Source = Source.MEASURED,
    trace_id: str | None = None,
) -> bytes:
    """`call_accounting(...).model_dump_json(exclude_none=True)` as bytes, the record's
    stored body, built without the pydantic models (`accounting_wire`: the same bytes, a
    tenth of the cost) for the gateway's serving loop, which makes one per call. Raises
    what `call_accounting` raises."""
    _check(decision_id, network_bytes, compute_seconds)
    if compute_kind is Source.ESTIMATED:
        raise ValueError(f"decision {decision_id}: an accounting record holds measured or apportioned compute time, not an estimate")
    kind: Literal["measured", "apportioned"] = "apportioned" if compute_kind is Source.APPORTIONED else "measured"
    # float(): the models write an int as a float (2000.0); the structs would write it as given
    body = accounting_json(decision_id, time, target, detail, FigureWire(value=float(network_bytes), source="measured",
                                                                          method=network_method),
                           FigureWire(value=float(compute_seconds), source=kind, method=compute_method)
                           if compute_seconds is not None else None, trace_id)
    if body is not None:
        return body
    return call_accounting(decision_id, time, network_bytes=network_bytes, network_method=network_method,
                           compute_seconds=compute_seconds, compute_method=compute_method, target=target,
                           detail=detail, compute_kind=compute_kind, trace_id=trace_id).model_dump_json(exclude_none=True).encode()
