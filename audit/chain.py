"""The hash chain: what each stored entry's hash covers, and the index columns derived
from a record.

An entry's hash is sha256 over the previous entry's hash, its sequence number, its index
columns and its body (the record's JSON as stored). Covering the columns as well as the
body means that editing either is caught by re-hashing alone, without parsing a million
JSON bodies during `verify`; covering `seq` means that moving an entry is caught even when
its bytes are untouched. The first entry links to a genesis hash derived from the log's
random id, so entries cannot be transplanted between logs.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from .records import ActionRecord, DecisionRecord, EntryKind, Figure

CHAIN_VERSION = b"policyc.audit.chain/v1"

# Index columns, in table order. They are derived from the record at write time, hashed,
# and used by queries and reports.
COLUMNS: tuple[str, ...] = (
    "kind",
    "time",
    "decision_id",
    "tenant",
    "model",
    "region",
    "outcome",
    "action",
    "gpu_s",
    "gpu_src",
    "mem_b",
    "mem_src",
    "net_b",
    "net_src",
    "latency_s",
)

Columns = tuple[Any, ...]
_pack_seq = struct.Struct(">Q").pack


def genesis(log_id: str) -> bytes:
    """The hash the first entry links to."""
    return hashlib.sha256(CHAIN_VERSION + b"\x00genesis\x00" + log_id.encode()).digest()


def _col(v: Any) -> str:
    if v is None:
        return "\x00"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def digest(prev: bytes, seq: int, columns: Columns, body: str) -> bytes:
    """The hash of one entry. `columns` exactly as stored (floats as floats)."""
    head = "\x1f".join(map(_col, columns))
    return hashlib.sha256(prev + _pack_seq(seq) + head.encode() + b"\x1e" + body.encode()).digest()


def _figure(f: Figure | None) -> tuple[float | None, str | None]:
    return (float(f.value), f.source.value) if f is not None else (None, None)


def columns_of(record: DecisionRecord | ActionRecord) -> Columns:
    """The index columns of a record (see COLUMNS)."""
    if isinstance(record, DecisionRecord):
        r = record.resources
        gpu, gsrc = _figure(r.gpu_seconds)
        mem, msrc = _figure(r.memory_bytes)
        net, nsrc = _figure(r.network_bytes)
        region = record.placement.region if record.placement is not None else None
        return (
            EntryKind.DECISION.value,
            float(record.time),
            record.decision_id,
            record.tenant,
            record.model,
            region,
            record.outcome,
            None,
            gpu,
            gsrc,
            mem,
            msrc,
            net,
            nsrc,
            float(record.latency.total),
        )
    return (
        EntryKind.ACTION.value,
        float(record.time),
        record.decision_id,
        None,
        None,
        None,
        record.outcome,
        record.kind,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    )
