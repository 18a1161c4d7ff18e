"""Request headers → typed request variables, exactly as the bundle's header mappings say.

Each mapping parses its header by type (time `150ms` / `150 ms` / `1.5s`, bandwidth
`80GB/s`, ratio `40%`, FLOPs `1.2e12` or `1.2 TFLOP`, count, size, name, string, bool
yes/no/true/false), checks the declared `range` / `values`, and applies the author's
`missing` and `malformed` behaviour. A header the policy does not map is an error naming
it, except the standard HTTP/gRPC transport headers in `PASSTHROUGH_HEADERS` (and HTTP/2
pseudo-headers such as `:path`), which carry no policy meaning. Every problem is
collected, so a client learns about all of its bad headers at once.

A `malformed: ignore` header is dropped as though it had not been sent: its variable is
absent, or takes the declared default under `missing: default`.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

from policyc.compiler import units
from policyc.compiler.bundle import Bundle, HeaderMapping, Scalar
from policyc.compiler.diagnostic import Diagnostic
from policyc.compiler.meaning import QUANTITY_KINDS, did_you_mean
from policyc.compiler.value_types import Kind, kind_of

from .errors import RequestError, header_problem
from .request import Request

PASSTHROUGH_HEADERS: frozenset[str] = frozenset({
    # HTTP/1.1 and HTTP/2 transport and content negotiation
    "accept", "accept-encoding", "accept-language", "authorization", "cache-control", "connection",
    "content-encoding", "content-length", "content-type", "cookie", "host", "keep-alive", "origin",
    "pragma", "referer", "te", "trailer", "transfer-encoding", "upgrade", "user-agent", "via",
    # proxies and tracing
    "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip", "x-request-id",
    "traceparent", "tracestate", "baggage",
    # gRPC
    "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "grpc-message-type", "grpc-trace-bin",
    "grpc-tags-bin", "grpc-previous-rpc-attempts",
})

_NUMBER = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*\Z")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_BOOL = {"yes": True, "true": True, "no": False, "false": False}


class _Malformed(Exception):
    pass


def parse_value(text: str, mapping: HeaderMapping) -> Scalar:
    """The typed value of one header, or `_Malformed` saying what is wrong."""
    t = mapping.type
    raw = text.strip()
    kind = kind_of(t)
    if not raw and kind is not Kind.TEXT:
        raise _Malformed(f"empty value; expected {units.describe(t)}")
    if t in QUANTITY_KINDS:
        m = _NUMBER.match(raw)
        if m is None:
            raise _Malformed(f"`{raw}` is not {units.describe(t)}")
        number, unit = float(m.group(1)), m.group(2) or None
        if unit is not None and unit not in units.UNITS:
            raise _Malformed(f"unknown unit `{unit}` in `{raw}`; expected {units.describe(t)}")
        value = units.to_si(number, unit, t)
        if value is None:
            got = units.quantity_type(unit)
            if unit is None:
                raise _Malformed(f"`{raw}` has no unit; expected {units.describe(t)}")
            raise _Malformed(f"`{raw}` is {units.describe(got)}; expected {units.describe(t)}")
        if not math.isfinite(value):
            raise _Malformed(f"`{raw}` is not a finite number")
        rng = mapping.range
        if rng is not None and not (rng.lo <= value <= rng.hi):
            raise _Malformed(f"`{raw}` is out of range {units.format_si(rng.lo, t)} .. {units.format_si(rng.hi, t)}")
        return value
    if kind is Kind.FLAG:
        b = _BOOL.get(raw.lower())
        if b is None:
            raise _Malformed(f"`{raw}` is not yes/no/true/false")
        return b
    if kind is Kind.NAME:
        if not _NAME.match(raw):
            raise _Malformed(f"`{raw}` is not a name (letters, digits, `-`, `_`, `.`)")
        if mapping.values and raw not in mapping.values:
            close = did_you_mean(raw, mapping.values)
            hint = f"; did you mean `{close}`?" if close else ""
            raise _Malformed(f"`{raw}` is not one of {', '.join(mapping.values)}{hint}")
        return raw
    return raw  # string


class RequestParser:
    """Turns header dicts into `Request`s for one bundle; built once per bundle."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self._by_lower: dict[str, HeaderMapping] = {h.header.lower(): h for h in bundle.headers}
        self._tenant_class: dict[str, str] = {t.name: t.tenant_class for t in bundle.tenants}
        self._tenant_header = next((h.header for h in bundle.headers if h.var == "tenant"), "tenant")

    def parse(self, headers: Mapping[str, str], tenant: str | None = None) -> Request:
        """Parse or raise `RequestError` listing every problem. `tenant`, when given, is the
        caller's authenticated tenant; a tenant header that disagrees with it is refused."""
        problems: list[Diagnostic] = []
        given: dict[str, tuple[str, str]] = {}  # lower name -> (name as sent, value)
        for name, value in headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                problems.append(header_problem("E705", str(name), "header names and values must be text"))
                continue
            low = name.lower()
            if low in given:
                problems.append(header_problem("E704", name, f"given twice (also as `{given[low][0]}`)"))
                continue
            given[low] = (name, value)
            if low not in self._by_lower and low not in PASSTHROUGH_HEADERS and not low.startswith(":"):
                close = did_you_mean(low, self._by_lower)
                hint = f"; did you mean `{self._by_lower[close].header}`?" if close else \
                    f"; this policy reads {', '.join(h.header for h in self.bundle.headers) or 'no headers'}"
                problems.append(header_problem("E701", name, "unknown header" + hint))
        values: dict[str, Scalar] = {}
        for low, m in self._by_lower.items():
            if low not in given:
                if m.on_missing == "reject":
                    problems.append(header_problem("E702", m.header, "required header is missing"))
                elif m.on_missing == "default" and m.default is not None:
                    values[m.var] = m.default
                continue
            try:
                values[m.var] = parse_value(given[low][1], m)
            except _Malformed as e:
                if m.on_malformed == "reject":
                    problems.append(header_problem("E703", m.header, str(e)))
                elif m.on_missing == "default" and m.default is not None:
                    values[m.var] = m.default
        if tenant is not None:
            sent = given.get(self._tenant_header.lower())
            if sent is not None and sent[1].strip() != tenant:
                problems.append(header_problem("E707", self._tenant_header,
                                               f"says `{sent[1].strip()}` but the caller is authenticated as `{tenant}`"))
            values["tenant"] = tenant
        t = values.get("tenant")
        if isinstance(t, str):
            cls = self._tenant_class.get(t)
            if cls is None:
                close = did_you_mean(t, self._tenant_class)
                hint = f"; did you mean `{close}`?" if close else ""
                problems.append(header_problem("E706", self._tenant_header, f"unknown tenant `{t}`{hint}"))
            else:
                values["tenant_class"] = cls
        if problems:
            raise RequestError(problems)
        return Request.of(values)
