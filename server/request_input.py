"""Turn the API's request (headers and/or typed attributes, tenant, retry count) into the
matcher's typed `Request`, or a `ServiceError` naming every problem.

Headers go through the bundle's header mappings (the matcher's parser). Typed attributes
bypass header parsing but are still checked against the request variables the bundle
declares and their types; their *values* (declared names, ranges) are the solver's to
judge, so a request for region `mars-1` reaches the feasibility check and is rejected
there with the rule that makes it impossible.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

from policyc.compiler.attributes import BODY_REQUEST_VARS
from policyc.compiler.bundle import Bundle, Scalar
from policyc.compiler.diagnostic import Diagnostic, error
from policyc.compiler.meaning import QUANTITY_KINDS, did_you_mean
from policyc.matcher import Request, RequestError
from policyc.matcher.errors import detail
from policyc.matcher.registry import Registry

from .decision import DecisionInput
from .errors import ServiceError, Status

RETRY_HEADER = "x-retry-count"
MAX_HEADERS = 64
MAX_VALUE_BYTES = 4096
MAX_NAME_CHARS = 256  # a header or attribute name, a tenant, a session id
MAX_RETRIES = 1000  # `X-Retry-Count`: a retry budget is a handful; 10²⁰ is an attack on a uint32
# RFC 9110: a field name is a token; a value is visible ASCII, spaces and tabs. Anything
# else (a NUL, a line break, full-width digits `１５０ms`) is refused here, at the edge,
# so that no parser downstream reads a digit a client did not mean as one.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\t\x20-\x7e]*")
_RETRY = re.compile(r"[0-9]{1,9}")


def shown(text: str, limit: int = 64) -> str:
    """User input as it may appear in a message: printable ASCII, escapes for the rest, cut short."""
    out = ascii(text[:limit])[1:-1]
    return out + ("…" if len(text) > limit else "")
QUANTITY_TYPES = QUANTITY_KINDS


def split_retry(headers: Mapping[str, str], retry_count: int) -> tuple[dict[str, str], int]:
    """Remove the transport-level `X-Retry-Count` header (the guardian's, not the policy's)
    and return the effective retry count."""
    rest: dict[str, str] = {}
    count = retry_count
    for k, v in headers.items():
        if k.lower() == RETRY_HEADER:
            text = v.strip()
            if not _RETRY.fullmatch(text) or int(text) > MAX_RETRIES:
                why = f"header `{k}`: `{shown(text)}` is not a whole number from 0 to {MAX_RETRIES}"
                raise ServiceError(Status.INVALID_ARGUMENT, why, (why,), field=f"headers.{k}", code="E708")
            count = max(count, int(text))
        else:
            rest[k] = v
    return rest, count


def _check_sizes(headers: Mapping[str, str]) -> None:
    """Count, size and characters of every header, before anything parses one."""
    if len(headers) > MAX_HEADERS:
        raise ServiceError(Status.INVALID_ARGUMENT, f"too many headers: {len(headers)} (at most {MAX_HEADERS})",
                           field="headers", code="E709")
    for k, v in headers.items():
        if len(k) > MAX_NAME_CHARS or not _TOKEN.fullmatch(k):
            why = f"header name `{shown(k)}` is not an HTTP field name (letters, digits and !#$%&'*+.^_`|~-, at most {MAX_NAME_CHARS})"
            raise ServiceError(Status.INVALID_ARGUMENT, why, (why,), field="headers", code="E709")
        if len(k) + len(v) > MAX_VALUE_BYTES:
            raise ServiceError(Status.INVALID_ARGUMENT, f"header `{k}`: value of {len(v)} bytes exceeds {MAX_VALUE_BYTES}",
                               field=f"headers.{k}", code="E709")
        if not _VALUE.fullmatch(v):
            bad = next(c for c in v if not ("\x20" <= c <= "\x7e" or c == "\t"))
            why = f"header `{k}`: the value holds {shown(bad)!s} (U+{ord(bad):04X}); a header value is printable ASCII"
            raise ServiceError(Status.INVALID_ARGUMENT, why, (why,), field=f"headers.{k}", code="E703")


def _check_names(inp: DecisionInput) -> None:
    for what, text in (("tenant", inp.tenant), ("session_id", inp.session)):
        if text is not None and (len(text) > MAX_NAME_CHARS or not _VALUE.fullmatch(text)):
            why = f"`{what}` must be printable ASCII of at most {MAX_NAME_CHARS} characters"
            raise ServiceError(Status.INVALID_ARGUMENT, why, (why,), field=what, code="E711")
    if len(inp.attributes) > MAX_HEADERS:
        raise ServiceError(Status.INVALID_ARGUMENT, f"too many attributes: {len(inp.attributes)} (at most {MAX_HEADERS})",
                           field="attributes", code="E711")
    for k, v in inp.attributes.items():
        if len(k) > MAX_NAME_CHARS or (isinstance(v, str) and len(v) > MAX_VALUE_BYTES):
            why = f"attribute `{shown(k)}`: name or value too long (at most {MAX_NAME_CHARS} and {MAX_VALUE_BYTES})"
            raise ServiceError(Status.INVALID_ARGUMENT, why, (why,), field="attributes", code="E711")
        if isinstance(v, float) and not math.isfinite(v):
            why = f"attribute `{shown(k)}`: {v} is not a finite number"
            raise ServiceError(Status.INVALID_ARGUMENT, why, (why,), field=f"attributes.{shown(k)}", code="E711")


def _var_types(bundle: Bundle) -> dict[str, str]:
    types: dict[str, str] = {h.var: h.type for h in bundle.headers}
    types.setdefault("tenant", "name")
    types["tenant_class"] = "name"
    for name, t in BODY_REQUEST_VARS.items():  # an LLM body's facts (the gateway's picker gives them)
        types.setdefault(name, t)
    return types


def _typed(bundle: Bundle, attributes: Mapping[str, Scalar]) -> dict[str, Scalar]:
    types = _var_types(bundle)
    problems: list[Diagnostic] = []
    out: dict[str, Scalar] = {}
    for name, value in attributes.items():
        t = types.get(name)
        if t is None:
            close = did_you_mean(name, types)
            hint = f"; did you mean `{close}`?" if close else f"; this policy reads {', '.join(sorted(types))}"
            problems.append(error("E710", f"attribute `{shown(name)}`: not a request variable of this bundle{hint}",
                                  field=f"attributes.{shown(name)}"))
            continue
        if name == "tenant_class":
            problems.append(error("E710", "attribute `tenant_class`: derived from the tenant, never given",
                                  field="attributes.tenant_class"))
            continue
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) if t in QUANTITY_TYPES else \
            isinstance(value, bool) if t == "bool" else isinstance(value, str)
        if not ok:
            want = "a number (SI units)" if t in QUANTITY_TYPES else "a flag" if t == "bool" else "text"
            problems.append(error("E711", f"attribute `{name}`: expected {want} for a `{t}` variable, "
                                          f"got {type(value).__name__} `{shown(repr(value))}`", field=f"attributes.{name}"))
            continue
        out[name] = float(value) if t in QUANTITY_TYPES else value
    if problems:
        raise ServiceError(Status.INVALID_ARGUMENT, "; ".join(p.message for p in problems), tuple(p.message for p in problems),
                           diagnostics=tuple(problems))
    return out


def to_request(registry: Registry, bundle: Bundle, inp: DecisionInput) -> tuple[Request, int]:
    """The typed request and the retry count, or ServiceError."""
    _check_sizes(inp.headers)
    _check_names(inp)
    headers, retry = split_retry(inp.headers, inp.retry_count)
    typed = _typed(bundle, inp.attributes) if inp.attributes else {}
    given = typed.get("tenant")
    tenant = inp.tenant or (given if isinstance(given, str) else None)
    try:
        parsed = registry.parse_request(headers, tenant)
    except RequestError as e:
        details = tuple(detail(p) for p in e.problems)
        tenant_only = all(p.code == "E706" for p in e.problems)  # unknown tenant
        raise ServiceError(Status.NOT_FOUND if tenant_only else Status.INVALID_ARGUMENT, str(e), details,
                           diagnostics=e.problems) from None
    if not typed:
        return parsed, retry
    values = dict(parsed.vars)
    lowered = {k.lower() for k in headers}
    by_var = {h.var: h.header for h in bundle.headers}
    for name, value in typed.items():
        h = by_var.get(name)
        if h is not None and h.lower() in lowered and values.get(name) != value:
            raise ServiceError(Status.INVALID_ARGUMENT, f"attribute `{name}` disagrees with header `{h}`",
                               field=f"attributes.{name}", code="E712")
        values[name] = value
    return Request.of(values), retry
