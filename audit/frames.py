"""The wire format between an `AuditLog` and its writer process: length-prefixed frames on
two pipes (records and commands one way, acknowledgements the other).

Frames rather than pickled objects because the decision thread's share of the work must be
a few microseconds: a record arrives already as bytes (its redacted JSON) or as plain values in MessagePack
(a decision draft the writer validates: `draft_encoder.wire_draft`), and the sender thread
moves many frames into the pipe with one `os.write`. The configuration frame is a `marshal`
(both ends run the same interpreter, which is what `marshal` requires).
"""

from __future__ import annotations

import marshal
import os
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

HEADER = struct.Struct(">IB")  # payload length, kind


class ToWriter(IntEnum):
    """Frames the log sends to its writer. BODY and DRAFT each take the next ticket, DRAFTS
    as many as it holds."""

    INIT = 0  # marshal(dict): the writer's configuration, first frame only
    BODY = 1  # a record's redacted JSON, stored as is
    DRAFT = 2  # MessagePack map: a decision draft to validate, redact and serialise
    CHECKPOINT = 3  # seal the chain now
    CLOSE = 4  # store everything before this, write the final checkpoint, exit
    DRAFTS = 5  # COUNT, then a MessagePack array of COUNT drafts; takes COUNT tickets
    ROTATE = 6  # store everything before this, close the live segment, start the next (`segments.py`)


COUNT = struct.Struct(">I")  # drafts in a DRAFTS frame


class FromWriter(IntEnum):
    """Frames the writer sends back."""

    ACK = 1  # marshal(Ack fields): tickets [first, end) are settled
    FATAL = 2  # utf-8 message: the writer cannot continue
    CLOSED = 3  # utf-8 message (empty when the final checkpoint was written)
    READY = 4  # empty: the log is open and its opening checkpoint durable
    ROTATED = 5  # utf-8 JSON: {"segment": closed segment's number, "seq": its last entry} or {"error": why not}


@dataclass(frozen=True, slots=True)
class Ack:
    """Tickets `first`..`end - 1` are settled: durable, except the `failed` ranges
    (lo, hi, message). `seq_base` is the seq the first stored ticket of the range got;
    later stored tickets follow in order. `last_seq` and `commits` are the writer's totals;
    `commit_s` how long this batch's commit (insert and fsync) took, -1 when none ran."""

    first: int
    end: int
    seq_base: int
    failed: tuple[tuple[int, int, str], ...]
    last_seq: int
    commits: int
    commit_s: float = -1.0

    def encode(self) -> bytes:
        return frame(FromWriter.ACK, marshal.dumps((self.first, self.end, self.seq_base, self.failed, self.last_seq, self.commits,
                                                    self.commit_s)))

    @classmethod
    def decode(cls, payload: bytes) -> Ack:
        first, end, seq_base, failed, last_seq, commits, commit_s = marshal.loads(payload)
        return cls(first, end, seq_base, tuple(tuple(f) for f in failed), last_seq, commits, commit_s)


def frame(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind) + payload


def write_all(fd: int, data: bytes) -> None:
    """`os.write` until all of `data` is in the pipe (a blocking pipe may take it in parts)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def split(buf: bytearray) -> list[tuple[int, bytes]]:
    """Remove and return the complete frames at the start of `buf` (a partial one stays)."""
    out: list[tuple[int, bytes]] = []
    pos, size = 0, len(buf)
    hs = HEADER.size
    while pos + hs <= size:
        n, kind = HEADER.unpack_from(buf, pos)
        if pos + hs + n > size:
            break
        out.append((kind, bytes(buf[pos + hs : pos + hs + n])))
        pos += hs + n
    del buf[:pos]
    return out


def dumps(value: Any) -> bytes:
    """`marshal` of plain values, with a clear error for anything else."""
    try:
        return marshal.dumps(value)
    except ValueError as e:
        raise TypeError(f"audit draft must hold only dicts, lists, tuples, str, int, float, bool and None ({e})") from None
