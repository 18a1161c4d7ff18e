"""Decide's per-decision response fields written as protobuf wire bytes directly.

Every Decide answer has fields of its own (decision id, timing, the placement's figures),
written on the serving loop for every call. Building them as a `pb.Decision` costs a
message, a sub-message per part and a Python-to-upb assignment per field (~20 µs a call
here); most of those bytes repeat, though: an instance's identity fields (id, model,
host, GPU, class, NUMA node, RDMA port, region, endpoint), a dependency binding's names,
a contract's probes. So this writes the wire format itself: the repeating parts are
encoded once and kept (bounded memos), the figures are packed with one `struct` call per
sub-message (doubles are 8 little-endian bytes after a one-byte tag).

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

from .decision import Decision

K = TypeVar("K")
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


class _Memo(OrderedDict[K, bytes]):
    """A bounded memo of encoded bytes (the least recently added goes first)."""

    def get_or(self, key: K, make: Callable[[K], bytes]) -> bytes:
        hit = self.get(key)
        if hit is None:
            if len(self) >= MEMO_MAX:
                self.popitem(last=False)
            hit = self[key] = make(key)
        return hit


_identity: _Memo[tuple] = _Memo()
_bindings: _Memo[tuple[str, str, str]] = _Memo()
_probes: _Memo[tuple[str, ...]] = _Memo()
_STALE = _tag(16, 0) + b"\x01"
_SNAPSHOT = _tag(17, 0)
_SHARE_SOURCE: dict[str, bytes] = {}


def _identity_block(key: tuple) -> bytes:
    """Placement fields 1-7, 19, 20: the same for every decision placed on this instance."""
    instance_id, model, host, gpu, gpu_model, numa_node, rdma_port, region, endpoint = key
    return b"".join((text(1, instance_id), text(2, model), text(3, host), text(4, gpu), text(5, gpu_model),
                     (_tag(6, 0) + varint(numa_node)) if numa_node else b"", text(7, rdma_port or ""),
                     text(19, region), text(20, endpoint)))


def _binding_names(key: tuple[str, str, str]) -> bytes:
    return text(1, key[0]) + text(2, key[1]) + text(3, key[2])


def _probe_list(probes: tuple[str, ...]) -> bytes:
    return b"".join(text(18, x) for x in probes)


def placement_body(p: PlacementPlan, model: str, region: str, notes: tuple[str, ...], endpoint: str) -> bytes:
    """`convert.fill_placement(..., full=False)` as bytes."""
    key = (p.instance_id, model, p.host, p.gpu, p.gpu_model, p.numa_node, p.rdma_port, region, endpoint)
    parts = [_identity.get_or(key, _identity_block)]
    if p.queue_depth:
        parts.append(b"\x40" + varint(p.queue_depth))  # field 8, varint
    if p.share:
        parts.append(_DOUBLE.pack(9 << 3 | 1, p.share))
    src = p.share_source.value
    enc = _SHARE_SOURCE.get(src)
    if enc is None:
        enc = _SHARE_SOURCE[src] = text(10, src)
    parts.append(enc)
    lat = p.latency
    parts.append(_PREDICTED_HEAD + _PREDICTED.pack(9, lat.network * 1e3, 17, lat.queueing * 1e3, 25, lat.compute * 1e3,
                                                   33, lat.dependencies * 1e3, 41, lat.sigma * 1e3, 49, lat.total * 1e3))
    for n in notes:
        parts.append(text(12, n))
    for d in p.dependencies:
        names = _bindings.get_or((d.service, d.endpoint, d.role), _binding_names)
        parts.append(submessage(14, names + _TWO_DOUBLES.pack(33, d.predicted * 1e3, 41, d.bound * 1e3)))
    if p.session_move is not None:
        m = p.session_move
        parts.append(submessage(15, text(1, m.session) + text(2, m.from_gpu) + text(3, m.to_gpu) + text(4, m.reason)))
    if p.stale:
        parts.append(_STALE)
    if p.snapshot_version > 0:
        parts.append(_SNAPSHOT + varint(p.snapshot_version))
    if p.probes:
        parts.append(_probes.get_or(tuple(p.probes), _probe_list))
    return b"".join(parts)


def tail(d: Decision, rejection: bytes = b"") -> bytes:
    """The fields `convert.decision_head` leaves out, as bytes: decision id, model, timing,
    placement, and `rejection`, the rejection field as protobuf wrote it
    (`convert.rejection_field(d.rejection)`; empty when `d` has none)."""
    t = d.timing
    parts = [text(1, d.decision_id), text(4, d.model or ""),
             _TIMING_HEAD + _TIMING.pack(9, t.parse * 1e6, 17, t.feasibility * 1e6, 25, t.match * 1e6, 33, t.place * 1e6,
                                         41, t.total * 1e6)]
    if d.plan is not None:
        parts.append(submessage(5, placement_body(d.plan, d.model or "", d.region or "", d.notes, d.endpoint)))
    if rejection:
        parts.append(rejection)
    return b"".join(parts)


__all__ = ["placement_body", "tail"]
