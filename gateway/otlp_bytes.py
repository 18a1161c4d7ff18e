"""OTLP trace protobuf written directly (the wire format of
`opentelemetry/proto/trace/v1/trace.proto` and `collector/trace/v1/trace_service.proto`):
the few messages the picker's spans need, as bytes, without building message objects.

Why: the gateway's tracer (`tracing.py`) writes thousands of spans a second on a thread
that shares the GIL with the serving loop; concatenating pre-tagged fields costs a few
microseconds a span, where the SDK's span objects and its exporter's encoding cost ~100 µs.
The field numbers are the proto's; `tests/evidence/test_trace_export.py` decodes what is
written here with the published `opentelemetry-proto` classes.
"""

from __future__ import annotations

import re
import struct
from typing import Mapping, Sequence

KIND_INTERNAL = 1  # Span.SpanKind
KIND_SERVER = 2
MAX_TRACESTATE = 512  # W3C: a tracestate longer than 512 characters may be dropped

_TIMES = struct.Struct("<BQBQ")  # start_time_unix_nano (7, fixed64), end_time_unix_nano (8, fixed64)
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte (field number << 3 | 2), its length, the payload."""
    n = len(payload)
    return bytes((tag, n)) + payload if n < 0x80 else bytes((tag,)) + _varint(n) + payload


def parse_traceparent(value: str) -> tuple[bytes, bytes] | None:
    """(trace id, parent span id) of a W3C traceparent (version 00, or a later one read as
    00 prescribes), or None when it is malformed or names the all-zero trace or span."""
    m = _TRACEPARENT.match(value)
    if m is None or m.group(1) == "ff" or (m.group(1) == "00" and len(value) != 55):
        return None
    trace, parent = m.group(2), m.group(3)
    if trace == _ZERO_TRACE or parent == _ZERO_SPAN:
        return None
    return bytes.fromhex(trace), bytes.fromhex(parent)


def string_attribute(key: str, value: str) -> bytes:
    """A `Span.attributes` entry (field 9): KeyValue{key, AnyValue{string_value}}."""
    return _field(0x4A, _field(0x0A, key.encode()) + _field(0x12, _field(0x0A, value.encode())))


_LABELS: dict[tuple[str, int], bytes] = {}  # (name, kind) -> the span's name and kind fields (a handful of stage names)


def _label(name: str, kind: int) -> bytes:
    got = _LABELS.get((name, kind))
    if got is None:
        got = _LABELS[(name, kind)] = _field(0x2A, name.encode()) + bytes((0x30, kind))
    return got


def pick_spans(trace_id: bytes, parent_id: bytes, ids: bytes, root: tuple[str, int, int],
               stages: Sequence[tuple[str, int, int]], attributes: bytes = b"", trace_state: str = "") -> bytes:
    """A span `root` (name, start ns, end ns; a SERVER span, child of `parent_id`) and its
    INTERNAL children `stages`, as concatenated `ScopeSpans.spans` entries (Span: trace_id 1,
    span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6, start 7 and end 8 as fixed64,
    attributes 9), the parts they share written once. `ids`: 8 bytes a span, the root's
    first; `attributes`: entries written by `string_attribute`, concatenated, on every span.

    Written as one list of parts joined once (each span's length is the sum of its parts'
    known sizes): the exporter's thread writes five spans a traced request."""
    head = b"\x0a\x10" + trace_id + b"\x12\x08"
    times = _TIMES.pack
    root_id = ids[:8]
    name, a, b = root
    state = _field(0x1A, trace_state.encode()) if trace_state else b""
    label = _label(name, KIND_SERVER)
    shared = _FIXED + len(attributes)
    n = shared + len(state) + len(label)
    parts = [b"\x12" + _varint(n) if n > 0x7F else bytes((0x12, n)), head, root_id, state, b"\x22\x08", parent_id, label,
             times(0x39, a, 0x41, b), attributes]
    child_of = b"\x22\x08" + root_id
    for i, (name, a, b) in enumerate(stages, 1):
        label = _label(name, KIND_INTERNAL)
        n = shared + len(label)
        parts += (b"\x12" + _varint(n) if n > 0x7F else bytes((0x12, n)), head, ids[8 * i:8 * i + 8], child_of, label,
                  times(0x39, a, 0x41, b), attributes)
    return b"".join(parts)


_FIXED = 20 + 8 + 10 + 18  # a span's fixed-size fields: the trace id (tag, length, 16 bytes) with the span id's tag and length; the span id; the parent's field; the two times


def resource(attributes: Mapping[str, str]) -> bytes:
    """A `ResourceSpans.resource` field (1): Resource{attributes}."""
    return _field(0x0A, b"".join(_field(0x0A, _field(0x0A, k.encode()) + _field(0x12, _field(0x0A, v.encode())))
                                 for k, v in attributes.items()))


def scope(name: str) -> bytes:
    """A `ScopeSpans.scope` field (1): InstrumentationScope{name}."""
    return _field(0x0A, _field(0x0A, name.encode()))


def export_request(resource_field: bytes, scope_field: bytes, spans: Sequence[bytes]) -> bytes:
    """An `ExportTraceServiceRequest` with one resource and one scope holding `spans`
    (each `pick_spans`'s bytes)."""
    scope_spans = _field(0x12, scope_field + b"".join(spans))
    return _field(0x0A, resource_field + scope_spans)
