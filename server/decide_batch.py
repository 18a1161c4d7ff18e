"""DecideBatch on the wire: a batch split into its requests' own bytes, and decisions joined.

A `DecideBatchRequest` is `repeated DecideRequest requests = 1`: on the wire, one
length-delimited field per request whose payload is exactly the bytes a unary `Decide`
would carry. Splitting the batch at those boundaries (without parsing it) gives each
request the same key in the request-shape cache as the unary call, and joining the
serialized decisions the same way writes the `DecideBatchResponse` without building
messages. A field other than `requests`, or a truncated one, is refused with the offset.
"""

from __future__ import annotations

from .decision_wire import varint

MAX_BATCH = 1024
_TAG = 0x0A  # field 1, wire type 2 (length-delimited)


class BadBatch(ValueError):
    """The batch is not a well-formed `DecideBatchRequest` (or holds too many requests)."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    n = len(buf)
    while True:
        if i >= n:
            raise BadBatch(f"truncated length at byte {i}")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 35:
            raise BadBatch(f"length too long at byte {i}")


def split_requests(raw: bytes) -> list[bytes]:
    """The bytes of each `DecideRequest` in the batch, in order."""
    out: list[bytes] = []
    i, n = 0, len(raw)
    while i < n:
        if raw[i] != _TAG:
            raise BadBatch(f"byte {i}: expected field 1 (`requests`), found tag 0x{raw[i]:02x}")
        size, i = _varint(raw, i + 1)
        if i + size > n:
            raise BadBatch(f"request {len(out)} runs past the end of the batch")
        out.append(raw[i:i + size])
        i += size
        if len(out) > MAX_BATCH:
            raise BadBatch(f"a batch holds at most {MAX_BATCH} requests")
    return out


def join_decisions(decisions: list[bytes]) -> bytes:
    """A `DecideBatchResponse` holding the serialized decisions, in order."""
    parts: list[bytes] = []
    for d in decisions:
        parts.append(b"\x0a" + varint(len(d)))
        parts.append(d)
    return b"".join(parts)
