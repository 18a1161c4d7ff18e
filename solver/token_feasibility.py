"""Can any GPU class give an LLM request its first token in time?

An LLM contract states a time to first token (`llm.ttft`) and the FLOPs of the prefill per
prompt token (`llm.prefill`). The first token cannot come before the whole prompt has been
through the model, so a request whose prefill takes longer than the TTFT on a whole GPU of
the fastest class the contract may use cannot be served by any instance, whatever the
fleet's load: it is infeasible, and the reason names the contract's `llm.ttft` line.

    fastest prefill = llm.prefill * prompt_tokens / max over classes of rate(class)

(`rate`: `meaning.compute_rate`, the class's peak at the contract's precision times its
efficiency; classes outside the contract's `gpu_arch` do not count.)

This depends on the request's exact `prompt_tokens`, which the solver's shape cache merges
between rule thresholds, so `RequestFeasibility` asks it before its cache, never caching
its answer: a dict lookup, a multiplication and a comparison per request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policyc.compiler.bundle import Contract, GpuClass, Scalar, SourceRef
from policyc.compiler.meaning import compute_rate


@dataclass(frozen=True, slots=True)
class FirstTokenBound:
    """One LLM contract's fastest prefill and the TTFT it must meet."""

    contract: str
    prefill_flops: float  # per prompt token
    ttft: float  # seconds
    rate: float  # FLOP/s of a whole GPU of the fastest class
    gpu: str  # that class
    span: SourceRef  # where `llm.ttft` is written

    def max_prompt_tokens(self) -> float:
        """The longest prompt whose prefill meets the TTFT on a whole GPU of the fastest class."""
        return self.ttft * self.rate / self.prefill_flops if self.prefill_flops > 0 else math.inf


def first_token_bounds(contracts: Iterable[Contract], catalog: Iterable[GpuClass]) -> dict[str, FirstTokenBound | None]:
    """Per LLM contract with a TTFT, its bound; None for one no class of `catalog` can run
    (another stage refuses those, with their own reason)."""
    classes = tuple(catalog)
    out: dict[str, FirstTokenBound | None] = {}
    for c in contracts:
        llm = c.llm
        if llm is None or llm.ttft is None or llm.ttft <= 0:
            continue
        best: tuple[float, str] | None = None
        for g in classes:
            if c.gpu_arch and g.arch not in c.gpu_arch:
                continue
            rate = compute_rate(c.compute, g)
            if rate is not None and rate > 0 and (best is None or rate > best[0]):
                best = (rate, g.name)
        out[c.name] = None if best is None else FirstTokenBound(c.name, llm.prefill_flops, llm.ttft, best[0], best[1],
                                                               c.span_of("llm.ttft"))
    return out


def first_token_refusal(bounds: Mapping[str, FirstTokenBound | None], variables: Mapping[str, Scalar]) -> tuple[str, SourceRef] | None:
    """The reason and the `llm.ttft` span when the request's prompt cannot get its first
    token in time on any GPU class; None otherwise (no model, not an LLM contract, no prompt)."""
    if not bounds:
        return None
    model = variables.get("model")
    b = bounds.get(model) if isinstance(model, str) else None
    if b is None:
        return None
    n = variables.get("prompt_tokens")
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n > b.max_prompt_tokens():
        return None
    seconds = b.prefill_flops * n / b.rate
    why = (f"`{b.contract}` cannot give its first token in time: the prefill of {n:g} prompt tokens "
            f"({b.prefill_flops * n:.3g} FLOPs) takes {seconds * 1e3:.1f} ms on a whole {b.gpu}, the fastest class it may use, "
            f"over its time to first token of {b.ttft * 1e3:g} ms (llm.ttft, {b.span.file}:{b.span.line}; "
            f"at most {math.floor(b.max_prompt_tokens()):,} prompt tokens)")
    return why, b.span


__all__ = ["FirstTokenBound", "first_token_bounds", "first_token_refusal"]
