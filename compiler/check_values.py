"""The value rules every bundle entity must satisfy, checked on the lowered IR.

The lowering passes refuse bad values where they are written (the narrowest span); this
pass states the same rules once more over the entities themselves, so that the compiler
(from `resolve`) and every bundle loader (`revalidate.py`) run one function: a bundle
whose JSON was edited and re-hashed — FLOPs upside down, an efficiency of −1 or NaN, zero
tokens or 10⁴⁰, a negative SLO, zero GPU peaks, an inverted header range, quarantine
shares above 100 % — is refused exactly as its source would have been. Helpers such as
`version_bounds_problem` are shared with the lowering passes so the rule and its
message exist once.

Spans are the entity's recorded origin (`file:line:col` of the block or field).
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Sequence

from policyc.compiler.diagnostic import Diagnostic, Span, error

from . import limits
from .meaning import ValueKind
from .value_types import fits, takes_range, takes_values
from .bundle import (Breaker, Contract, GpuClass, HeaderMapping, Quarantine, Redirect, SelfHeal, SourceRef,
                     Tenant, VersionBound)

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
ARCHS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
_T, _R, _S = ValueKind.TIME, ValueKind.RATIO, ValueKind.SIZE  # the value-type table's words (`value_types.py`)
SIGNALS: dict[str, str] = {
    "elapsed": _T, "sm_utilization": _R, "tls_handshake": _T, "connect_time": _T,
    "stream_time": _T, "time_to_first_byte": _T,  # the kernel walker's per-stream time; the gateway's TTFB
    "rdma_watermark": _R, "pcie_utilization": _R, "error_rate": _R, "gpu_memory_free": _S,
}
MAX_CONSECUTIVE = 1_000_000
_VERSION = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9}){0,%d}" % (limits.MAX_VERSION_PARTS - 1))
# what may travel in an HTTP header a redirect adds (RFC 9110 token / field-value)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]{0,4096}")


def span(r: SourceRef) -> Span:
    return r.span()


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def interval_problem(lo: float, hi: float, what: str) -> str | None:
    """`lo .. hi` must be finite, non-negative and the right way up."""
    if not finite(lo) or not finite(hi):
        return f"`{what}` is not a finite range"
    if lo < 0:
        return f"`{what}` must not be negative"
    if lo > hi:
        return f"`{what}` is upside down: the low end is above the high end"
    return None


def version_key(text: str) -> tuple[int, ...] | None:
    if not _VERSION.fullmatch(text):
        return None
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (limits.MAX_VERSION_PARTS - len(parts)))


def version_bounds_problem(bounds: Sequence[VersionBound]) -> str | None:
    """None when some version satisfies every bound (`>= 13.0, < 12.0` satisfies none)."""
    lo: tuple[tuple[int, ...], bool] | None = None  # (version, inclusive)
    hi: tuple[tuple[int, ...], bool] | None = None
    pins: set[tuple[int, ...]] = set()
    for b in bounds:
        k = version_key(b.version)
        if k is None:
            return f"`{b.version}` is not a version (digits and dots, at most {limits.MAX_VERSION_PARTS} parts)"
        if b.op == "==":
            pins.add(k)
        elif b.op in (">", ">="):
            cand = (k, b.op == ">=")
            if lo is None or cand[0] > lo[0] or (cand[0] == lo[0] and not cand[1]):
                lo = cand
        else:
            cand = (k, b.op == "<=")
            if hi is None or cand[0] < hi[0] or (cand[0] == hi[0] and not cand[1]):
                hi = cand
    if len(pins) > 1:
        return "the version bounds pin two different versions"
    for p in pins:
        if (lo and (p < lo[0] or (p == lo[0] and not lo[1]))) or (hi and (p > hi[0] or (p == hi[0] and not hi[1]))):
            return "no version satisfies these bounds"
    if lo and hi and (lo[0] > hi[0] or (lo[0] == hi[0] and not (lo[1] and hi[1]))):
        return "no version satisfies these bounds"
    return None


def quarantine_problem(q: Quarantine) -> tuple[str, str] | None:
    """(field, message) for a quarantine that cannot work as written."""
    if not finite(q.duration) or q.duration <= 0:
        return "duration", "`duration` must be greater than zero"
    if not finite(q.max_duration) or q.max_duration < q.duration:
        return "max_duration", "`max_duration` must be at least `duration`"
    if not finite(q.max_share) or not 0 < q.max_share <= 1:
        return "max_share", "`max_share` must be above 0 % and at most 100 %"
    return None


class _Checker:
    def __init__(self, diags: list[Diagnostic]) -> None:
        self.diags = diags

    def err(self, code: str, message: str, where: SourceRef, help: str | None = None) -> None:
        self.diags.append(error(code, message, span(where), help))

    # ------------------------------------------------------------------ contracts
    def contract(self, c: Contract) -> None:
        where = f"contract `{c.name}`"
        at = c.span_of
        f = c.compute.flops
        if (p := interval_problem(f.lo, f.hi, "flops")) is not None:
            self.err("E325", f"{p} in {where}", at("compute.flops"))
        elif f.hi <= 0:
            self.err("E305", f"`flops` must be greater than zero in {where}", at("compute.flops"))
        if not 1 <= c.compute.tokens <= limits.MAX_TOKENS:
            self.err("E327", f"`tokens` must be between 1 and {limits.MAX_TOKENS:,} in {where}", at("compute.tokens"))
        if c.compute.precision not in PRECISIONS:
            self.err("E310", f"`{c.compute.precision}` is not a valid `precision` in {where}", at("compute.precision"),
                     f"one of: {', '.join(PRECISIONS)}")
        e = c.compute.efficiency
        if not finite(e) or not 0 < e <= 1:
            self.err("E305", f"`efficiency` must be above 0 % and at most 100 % in {where}", at("compute.efficiency"))
        self.positive(c.memory.bandwidth_min, "bandwidth", where, at("memory.bandwidth"))
        self.positive(c.memory.burst_max, "burst", where, at("memory.burst"))
        seen: set[str] = set()
        for s in c.dependencies.services:
            if s.name in seen:
                self.err("E209", f"service `{s.name}` is declared twice in {where}", s.origin)
            seen.add(s.name)
            self.positive(s.p99, "p99", f"service `{s.name}`", s.origin)
        if (p := version_bounds_problem(c.dependencies.cuda)) is not None:
            self.err("E326", f"`cuda`: {p} in {where}", at("dependencies.cuda"))
        if c.slo is not None:
            self.positive(c.slo.latency, "latency", where, at("slo.latency"))
            if not finite(c.slo.allowance) or c.slo.allowance < 0:
                self.err("E305", f"`allowance` must not be negative in {where}", at("slo.allowance"))
        for key, values, allowed in (("regions", c.regions, None), ("gpu_arch", c.gpu_arch, ARCHS), ("security", c.security, None)):
            self.unique_names(values, key, where, at(f"placement.{key}"), allowed)
        keys = [k for k, _ in c.labels]
        if len(set(keys)) != len(keys):
            self.err("E202", f"a label is given twice in {where}", c.origin)
        for share in c.gpu_shares:
            ok = share.min_share is not None and finite(share.min_share) and 0 < share.min_share <= 1
            if share.feasible != ok:
                self.err("E601", f"GPU share for `{share.gpu}` in {where} is not a share in (0, 1] of a feasible class",
                         c.origin)

    def positive(self, x: float, key: str, where: str, at: SourceRef) -> None:
        if not finite(x) or x <= 0:
            self.err("E305", f"`{key}` must be a finite number greater than zero in {where}", at)

    def unique_names(self, values: Iterable[str], key: str, where: str, at: SourceRef,
                     allowed: Sequence[str] | None = None) -> None:
        seen: set[str] = set()
        for v in values:
            if allowed is not None and v not in allowed:
                self.err("E310", f"`{v}` is not a valid `{key}` in {where}", at, f"one of: {', '.join(allowed)}")
            elif not v:
                self.err("E309", f"`{key}` holds an empty name in {where}", at)
            elif v in seen:
                self.err("E311", f"`{v}` is listed twice in `{key}` of {where}", at)
            seen.add(v)

    # ------------------------------------------------------------------ GPU catalog
    def gpu(self, g: GpuClass) -> None:
        where = f"gpu `{g.name}`"
        if g.arch not in ARCHS:
            self.err("E310", f"`{g.arch}` is not a valid `arch` in {where}", g.origin, f"one of: {', '.join(ARCHS)}")
        self.positive(g.hbm_bandwidth, "hbm_bandwidth", where, g.origin)
        self.positive(g.memory, "memory", where, g.origin)
        if not g.peak_flops:
            self.err("E204", f"`peak` of {where} lists no precision", g.origin)
        seen: set[str] = set()
        for precision, v in g.peak_flops:
            if precision not in PRECISIONS or precision in seen:
                self.err("E310", f"`{precision}` is not a valid, once-given precision in `peak` of {where}", g.origin)
            seen.add(precision)
            self.positive(v, precision, f"`peak` of {where}", g.origin)

    # ------------------------------------------------------------------ requests
    def header(self, h: HeaderMapping) -> None:
        where = f"header `{h.header}`"
        if not _HEADER_NAME.fullmatch(h.header):
            self.err("E207", f"`{h.header[:64]}` is not an HTTP header name", h.origin)
        if h.range is not None:
            if not takes_range(h.type):
                self.err("E316", f"`range` applies to quantities, and `{h.header}` is of type `{h.type}`", h.origin)
            elif (p := interval_problem(h.range.lo, h.range.hi, "range")) is not None:
                self.err("E325", f"{p} in {where}", h.origin)
        if h.values and not takes_values(h.type):
            self.err("E316", f"`values` applies to headers of type `name`, and `{h.header}` is of type `{h.type}`", h.origin)
        self.unique_names(h.values, "values", where, h.origin)
        if (h.on_missing == "default") != (h.default is not None):
            self.err("E210", f"{where}: `default` is given exactly when `missing: default`", h.origin)
        if h.default is not None and not _scalar_of(h.default, h.type):
            self.err("E301", f"the `default` of {where} is not {h.type}", h.origin)
        elif h.default is not None and h.values and h.default not in h.values:
            self.err("E310", f"default `{h.default}` is not one of the header's `values`", h.origin)

    def tenant(self, t: Tenant) -> None:
        if not t.name or not t.tenant_class:
            self.err("E309", "a tenant and its class are names", t.origin)

    # ------------------------------------------------------------------ breakers
    def breaker(self, b: Breaker) -> None:
        where = f"breaker `{b.name}`"
        if not b.conditions:
            self.err("E204", f"{where} has no condition", b.origin)
        for c in b.conditions:
            t = SIGNALS.get(c.signal)
            if t is None:
                self.err("E412", f"unknown signal `{c.signal}` in {where}", c.origin)
                continue
            if not finite(c.value) or c.value < 0:
                self.err("E305", f"`{c.signal}` is compared with a value that is not a finite, non-negative number", c.origin)
            elif c.of is not None and c.signal != "elapsed":
                self.err("E324", f"only `elapsed` may be written as a share, in {where}", c.origin)
            elif c.of is None and t == ValueKind.RATIO and c.value > 1:
                self.err("E328", f"`{c.signal}` is a percentage: compare it with at most 100 %", c.origin)
        if not 1 <= b.consecutive <= MAX_CONSECUTIVE:
            self.err("E327", f"`consecutive` must be between 1 and {MAX_CONSECUTIVE:,} in {where}", b.origin)
        if not finite(b.retry_budget) or not 0 < b.retry_budget <= 1:
            self.err("E328", f"`retry_budget` must be above 0 % and at most 100 % in {where}", b.origin)
        if not b.actions:
            self.err("E204", f"{where} has no action", b.origin)
        for a in b.actions:
            if isinstance(a, Quarantine) and (qp := quarantine_problem(a)) is not None:
                self.err("E329", f"{qp[1]} in `quarantine` of {where}", b.origin)
            elif isinstance(a, SelfHeal) and not a.steps:
                self.err("E204", f"`self_heal` of {where} has no steps", b.origin)
            elif isinstance(a, Redirect):
                for k, v in a.headers:
                    if not _HEADER_NAME.fullmatch(k) or not _HEADER_VALUE.fullmatch(v):
                        self.err("E312", f"`redirect` of {where} adds a header that is not a valid HTTP header", b.origin,
                                 "a header name is a token; a value is printable ASCII without line breaks")


def _scalar_of(v: object, vtype: str) -> bool:
    return fits(v, vtype)  # the value-type table's (`value_types.py`)


def check_values(contracts: Iterable[Contract], gpus: Iterable[GpuClass], headers: Iterable[HeaderMapping],
                 tenants: Iterable[Tenant], breakers: Iterable[Breaker], diags: list[Diagnostic]) -> None:
    """Append a diagnostic for every entity value the compiler would not have produced."""
    ch = _Checker(diags)
    for c in contracts:
        ch.contract(c)
    for g in gpus:
        ch.gpu(g)
    for h in headers:
        ch.header(h)
    for t in tenants:
        ch.tenant(t)
    for b in breakers:
        ch.breaker(b)
