"""What of a request's headers, as Envoy hands them over, the policy reads.

A request through the gateway carries more than the policy's headers: HTTP/2 pseudo
headers, transport and tracing headers (`te`, `user-agent`, `x-request-id` — unique per
request), Envoy's own (`x-envoy-*`) and headers meant for the model server (`x-policyc-*`,
e.g. the stall control the tests use), and what the OpenAI SDKs say about themselves
(`x-stainless-*`, `openai-*`). Those are not the policy's to judge and must not
key the request-shape cache (a per-request id would make every request a new shape).
Everything else goes to the bundle's header parser, so a misspelt policy header is still
refused with "did you mean".
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from policyc.matcher.parse import PASSTHROUGH_HEADERS

# (`x-stainless-*`, `openai-*`: what the OpenAI SDKs send about themselves and the caller's
# OpenAI organisation and project, on every request: client metadata, not a policy's input)
NOT_POLICY_PREFIXES = (":", "x-envoy-", "x-policyc-", "x-gateway-", "grpc-", "x-stainless-", "openai-")


def header_map(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Lower-case names (HTTP/2 sends them so); a repeated header keeps its values joined
    by `,` as HTTP does, so the parser sees one value and can refuse it."""
    out: dict[str, str] = {}
    for k, v in pairs:
        k = k.lower()
        out[k] = f"{out[k]},{v}" if k in out else v
    return out


def policy_headers(headers: Mapping[str, str], forwarded: frozenset[str] = frozenset()) -> dict[str, str]:
    """The headers the policy reads: all but pseudo, transport/tracing, Envoy's, the
    gateway's and model-server headers, and those named in `forwarded` (lower case)."""
    return {k: v for k, v in headers.items()
            if k not in PASSTHROUGH_HEADERS and k not in forwarded and not k.startswith(NOT_POLICY_PREFIXES)}


def policy_view(pairs: Iterable[tuple[str, str]], forwarded: frozenset[str] = frozenset()) -> dict[str, str]:
    """`policy_headers(header_map(pairs), forwarded)` in one pass (the picker's hot path:
    most of a request's headers are skipped before their value is even read)."""
    out: dict[str, str] = {}
    for k, v in pairs:
        k = k.lower()
        if k in PASSTHROUGH_HEADERS or k in forwarded or k.startswith(NOT_POLICY_PREFIXES):
            continue
        out[k] = f"{out[k]},{v}" if k in out else v
    return out


def shape_key(headers: Mapping[str, str]) -> bytes:
    """The request-shape cache key: the policy headers, sorted (one shape per distinct set)."""
    return "\n".join(f"{k}\x00{v}" for k, v in sorted(headers.items())).encode("utf-8", "surrogateescape")


def attributes_key(attributes: Mapping[str, object]) -> bytes:
    """The part of the shape key that typed request variables add (an LLM body's facts)."""
    return b"\x01" + "\n".join(f"{k}\x00{v!r}" for k, v in sorted(attributes.items())).encode("utf-8", "surrogateescape")


class PolicyView:
    """`policy_view` for the picker's hot path: what each header name means (skipped, or the
    policy's name for it, lower case) is worked out once per distinct name, so a request's
    headers cost a dict look-up each and only the policy's values are decoded. Envoy hands
    over the same few names on every request; the memo is bounded (names come from clients)."""

    LIMIT = 4096

    def __init__(self, forwarded: frozenset[str] = frozenset()) -> None:
        self.forwarded = forwarded
        self._names: dict[str, str] = {}  # header name as sent -> the policy's name, "" for skipped

    def _name(self, key: str) -> str:
        k = key.lower()
        name = "" if k in PASSTHROUGH_HEADERS or k in self.forwarded or k.startswith(NOT_POLICY_PREFIXES) else k
        if len(self._names) >= self.LIMIT:
            self._names.clear()
        self._names[key] = name
        return name

    def of(self, headers: Iterable[Any]) -> dict[str, str]:
        """The policy's headers among Envoy's `HeaderValue`s (`key`, and `raw_value` or `value`)."""
        names = self._names
        out: dict[str, str] = {}
        for h in headers:
            key = h.key
            name = names.get(key)
            if name is None:
                name = self._name(key)
            if not name:
                continue
            raw = h.raw_value
            v = raw.decode("utf-8", "replace") if raw else h.value
            out[name] = f"{out[name]},{v}" if name in out else v
        return out
