"""An LLM request priced by its own tokens: the FLOPs and the GPU share it needs.

A contract's `compute.tokens` is one constant request; an LLM request's cost is its own
prompt and `max_tokens` (`meaning.llm_cost`: prefill FLOPs per prompt token times the
prompt, decode FLOPs per output token times the output). For a contract with an `llm`
block and a request whose body gave `prompt_tokens` (the gateway counts them), the placer
prices the request here instead of with the contract's constant:

    prefill = llm.prefill * prompt_tokens
    total   = prefill + llm.decode * output_tokens      (output: max_tokens, else the rest of the context)
    share   = max(bandwidth share,
                  total   / (rate * window)             (window: the SLO less its allowance)
                  prefill / (rate * llm.ttft))           (the first token within its TTFT)

on each GPU class of the catalog (`rate`: `meaning.compute_rate`). A share over 1 cannot be
given: the class is refused for this request, the reason saying which term and how much of
a whole GPU it needs. The prediction's compute term is `total` FLOPs on the share used.
Without `max_tokens` the output is the rest of the context (what vLLM would let it
generate), so the price is an upper bound, as the contract's `flops` upper bound is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from policyc.compiler.bundle import Contract, GpuClass, Llm, Scalar
from policyc.compiler.meaning import compute_rate, latency_window

from .plan import ShareSource
from .shares import ShareBound


@dataclass(frozen=True, slots=True)
class RequestPrice:
    """One LLM request's tokens, as its placement prices them."""

    prompt_tokens: float
    output_tokens: float
    output_given: bool  # False: no `max_tokens`, the output is the rest of the context

    def describe(self) -> str:
        out = f"{self.output_tokens:g} output" if self.output_given else f"up to {self.output_tokens:g} output (no max_tokens)"
        return f"{self.prompt_tokens:g} prompt + {out} tokens"


def _count(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        return None
    return float(x)


def request_price(contract: Contract, variables: Mapping[str, Scalar]) -> RequestPrice | None:
    """The request's price for `contract`, or None when the contract has no `llm` block or
    the request has no `prompt_tokens` (it is then priced at the contract's constant)."""
    llm = contract.llm
    if llm is None:
        return None
    prompt = _count(variables.get("prompt_tokens"))
    if prompt is None:
        return None
    out = _count(variables.get("max_tokens"))
    if out is not None:
        return RequestPrice(prompt, out, True)
    return RequestPrice(prompt, max(float(llm.context) - prompt, 1.0), False)


def priced_flops(llm: Llm, price: RequestPrice) -> tuple[float, float]:
    """(prefill FLOPs, prefill and decode FLOPs) of the request."""
    prefill = llm.prefill_flops * price.prompt_tokens
    return prefill, prefill + llm.decode_flops * price.output_tokens


def priced_bounds(contract: Contract, price: RequestPrice, base: Mapping[str, ShareBound],
                  catalog: Mapping[str, GpuClass]) -> dict[str, ShareBound]:
    """Per GPU class of `base` (the contract's own bounds), the share this request needs.
    A class the contract itself cannot use keeps its bound (and its refusal)."""
    llm = contract.llm
    assert llm is not None  # request_price gave a price only for an llm contract
    prefill, total = priced_flops(llm, price)
    window = latency_window(contract.slo)
    out: dict[str, ShareBound] = {}
    for name, b in base.items():
        gpu = catalog.get(name)
        rate = compute_rate(contract.compute, gpu) if gpu is not None else None
        if not b.feasible or gpu is None or rate is None or rate <= 0:
            out[name] = b
            continue
        bw = contract.memory.bandwidth_min / gpu.hbm_bandwidth
        terms: list[tuple[float, str]] = [(bw, f"bandwidth {contract.memory.bandwidth_min / 1e9:g} of {gpu.hbm_bandwidth / 1e9:g} GB/s")]
        if window is not None and window > 0:
            terms.append((total / (rate * window),
                          f"{total:.3g} FLOPs ({price.describe()}) within the {window * 1e3:g} ms compute budget"))
        if llm.ttft is not None and llm.ttft > 0:
            terms.append((prefill / (rate * llm.ttft),
                          (f"the prefill of {price.prompt_tokens:g} prompt tokens ({prefill:.3g} FLOPs) within the "
                           f"{llm.ttft * 1e3:g} ms time to first token")))
        share, why = max(terms, key=lambda t: t[0])
        if share > 1.0:
            out[name] = ShareBound(name, False, share, ShareSource.REQUEST,
                                   f"this request cannot be served on `{name}`: {why} needs {share:.2f} of a whole GPU")
        else:
            out[name] = ShareBound(name, True, share, ShareSource.REQUEST, f"priced by this request: {why}")
    return out


__all__ = ["RequestPrice", "priced_bounds", "priced_flops", "request_price"]
