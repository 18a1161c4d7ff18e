"""Decide's per-decision response fields written as protobuf wire bytes directly.

Every Decide answer has fields of its own (decision id, timing, the placement's figures),
written on the serving loop for every call. Building them as a `pb.Decision` costs a
message, a sub-message per part and a Python-to-upb assignment per field (~20 µs a call
here); most of those bytes repeat, though: an instance's identity fields (id, model,
host, GPU, class, NUMA node, RDMA port, region, endpoint) with what the snapshot says of
its GPU and port (queue depth, probes, staleness) and the share's source, and a
dependency binding's names. So this writes the wire format itself: the repeating parts
are encoded once and kept (bounded memos, one look-up per placement for the fixed
fields), the figures are packed with one `struct` call per sub-message (doubles are 8
little-endian bytes after a one-byte tag).

The result parses to the same message as `convert.decision(d)` minus its head (the
fields `convert.decision_head` writes): protobuf reads a field's occurrences in any
order, so only the order on the wire may differ (`tests/server/test_decision_wire.py`
holds them equal on real decisions and on every optional part). A rejection is written by
protobuf (`convert.rejection_field`), and kept per request shape by its caller while it repeats.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Callable, TypeVar

from policyc.placer import PlacementPlan
from policyc.placer.plan import DependencyBinding

from .decision import Decision

K = TypeVar("K")
V = TypeVar("V")
MEMO_MAX = 16384  # entries per memo (an instance's identity block is ~150 bytes)

_TIMING = struct.Struct("<BdBdBdBdBd")  # Timing: parse, feasibility, match, place, total (fields 1-5, wire type 1)
_PREDICTED = struct.Struct("<BdBdBdBdBdBd")  # PredictedLatency: fields 1-6
_TWO_DOUBLES = struct.Struct("<BdBd")  # DependencyBinding predicted_ms (4), bound_ms (5)
_DOUBLE = struct.Struct("<Bd")
_TIMING_HEAD = bytes((8 << 3 | 2, _TIMING.size))  # Decision.timing
_PREDICTED_HEAD = bytes((11 << 3 | 2, _PREDICTED.size))  # Placement.predicted


def varint(n: int) -> bytes:
    """An unsigned varint (a negative value is refused, as protobuf refuses it for uint fields)."""
    if n < 0:
        raise ValueError(f"value out of range for an unsigned field: {n}")
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _tag(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def text(field: int, s: str) -> bytes:
    """A string field (empty: nothing, as proto3 writes it)."""
    if not s:
        return b""
    b = s.encode()
    return _tag(field, 2) + varint(len(b)) + b


def submessage(field: int, body: bytes) -> bytes:
    return _tag(field, 2) + varint(len(body)) + body


class _Memo(OrderedDict[K, V]):
    """A bounded memo of encoded parts, `limit` entries (the least recently added goes first)."""

    def __init__(self, limit: int = MEMO_MAX) -> None:
        super().__init__()
        self.limit = limit

    def get_or(self, key: K, make: Callable[[K], V]) -> V:
        hit = self.get(key)
        if hit is None:
            if len(self) >= self.limit:
                self.popitem(last=False)
            hit = self[key] = make(key)
        return hit


_fixed: _Memo[tuple, bytes] = _Memo()
_bindings: _Memo[tuple[str, str, str], bytes] = _Memo()
# a plan's dependency bindings as their field-14 bytes, by the identity of its bindings tuple
# (the placer hands every plan on one candidate within a tick the same tuple): id -> (the
# tuple, kept so that no other object can take its id while the entry lives; its bytes). A
# tick's tuples are new ones, so only the latest few hundred are worth keeping (kept
# longer, they are objects every full collection scans).
DEPENDENCIES_MAX = 512
_dependencies: _Memo[int, tuple[tuple, bytes]] = _Memo(DEPENDENCIES_MAX)
_models: _Memo[str, bytes] = _Memo()  # Decision.model (field 4) as bytes, per model name
_versions: _Memo[int, bytes] = _Memo(64)  # Placement.snapshot_version (field 17) as bytes, per version
_STALE = _tag(16, 0) + b"\x01"
_SNAPSHOT = _tag(17, 0)
_DECISION_ID = _tag(1, 2)
_ID_LENGTH = 32  # `decision_ids.new_decision_id`'s, whose length prefix is written once here
_DECISION_ID_HEAD = _DECISION_ID + varint(_ID_LENGTH)


def _fixed_fields(key: tuple) -> bytes:
    """Placement fields 1-8, 10, 16, 18-20: the same for every decision placed on this
    instance through this port with these probes (the queue depth and probes are the
    snapshot's, per GPU and port; a few values each)."""
    (instance_id, model, host, gpu, gpu_model, numa_node, rdma_port, region, endpoint, queue_depth, share_source,
     stale, probes) = key
    return b"".join((text(1, instance_id), text(2, model), text(3, host), text(4, gpu), text(5, gpu_model),
                     (_tag(6, 0) + varint(numa_node)) if numa_node else b"", text(7, rdma_port or ""),
                     (b"\x40" + varint(queue_depth)) if queue_depth else b"",  # field 8, varint
                     text(10, share_source.value), _STALE if stale else b"",
                     b"".join(text(18, x) for x in probes), text(19, region), text(20, endpoint)))


def _snapshot_field(version: int) -> bytes:
    return _SNAPSHOT + varint(version)


def _binding_names(key: tuple[str, str, str]) -> bytes:
    return text(1, key[0]) + text(2, key[1]) + text(3, key[2])


def _model_field(model: str) -> bytes:
    return text(4, model)


def dependency_fields(bindings: tuple[DependencyBinding, ...]) -> bytes:
    """Placement.dependencies (field 14, one per binding) as bytes."""
    out = []
    for d in bindings:
        names = _bindings.get_or((d.service, d.endpoint, d.role), _binding_names)
        out.append(submessage(14, names + _TWO_DOUBLES.pack(33, d.predicted * 1e3, 41, d.bound * 1e3)))
    return b"".join(out)


def placement_body(p: PlacementPlan, model: str, region: str, notes: tuple[str, ...], endpoint: str) -> bytes:
    """`convert.fill_placement(..., full=False)` as bytes: the fixed fields from a memo,
    then this decision's figures."""
    key = (p.instance_id, model, p.host, p.gpu, p.gpu_model, p.numa_node, p.rdma_port, region, endpoint, p.queue_depth,
           p.share_source, p.stale, p.probes)
    fixed = _fixed.get(key)  # (inline: a hit is the common case)
    if fixed is None:
        fixed = _fixed.get_or(key, _fixed_fields)
    lat = p.latency
    parts = [fixed, _PREDICTED_HEAD, _PREDICTED.pack(9, lat.network * 1e3, 17, lat.queueing * 1e3, 25, lat.compute * 1e3,
                                                     33, lat.dependencies * 1e3, 41, lat.sigma * 1e3, 49, lat.total * 1e3)]
    if p.share:
        parts.append(_DOUBLE.pack(9 << 3 | 1, p.share))
    for n in notes:
        parts.append(text(12, n))
    deps = p.dependencies
    if deps:
        parts.append(_dependencies.get_or(id(deps), lambda _: (deps, dependency_fields(deps)))[1])
    if p.session_move is not None:
        m = p.session_move
        parts.append(submessage(15, text(1, m.session) + text(2, m.from_gpu) + text(3, m.to_gpu) + text(4, m.reason)))
    v = p.snapshot_version
    if v > 0:
        field = _versions.get(v)  # (inline: one version a tick, repeated by every plan of it)
        if field is None:
            field = _versions.get_or(v, _snapshot_field)
        parts.append(field)
    return b"".join(parts)


def tail(d: Decision, rejection: bytes = b"") -> bytes:
    """The fields `convert.decision_head` leaves out, as bytes: decision id, model, timing,
    placement, and `rejection`, the rejection field as protobuf wrote it
    (`convert.rejection_field(d.rejection)`; empty when `d` has none)."""
    t = d.timing
    did = d.decision_id.encode()
    model = d.model
    n = len(did)
    parts = [_DECISION_ID_HEAD + did if n == _ID_LENGTH else (_DECISION_ID + varint(n) + did if did else b""),
             _models.get_or(model, _model_field) if model else b"", _TIMING_HEAD,
             _TIMING.pack(9, t.parse * 1e6, 17, t.feasibility * 1e6, 25, t.match * 1e6, 33, t.place * 1e6, 41, t.total * 1e6)]
    if d.plan is not None:
        body = placement_body(d.plan, d.model or "", d.region or "", d.notes, d.endpoint)
        parts.append(b"\x2a")  # field 5, length-delimited
        parts.append(varint(len(body)))
        parts.append(body)
    if rejection:
        parts.append(rejection)
    return b"".join(parts)


__all__ = ["dependency_fields", "placement_body", "tail"]
