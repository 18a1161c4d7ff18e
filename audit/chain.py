"""The hash chain: what each stored entry's hash covers, and the index columns derived
from a record.

An entry's hash is sha256 over the previous entry's hash, its sequence number and its body
(the record's JSON bytes as stored). Covering `seq` means that moving an entry is caught
even when its bytes are untouched. The index columns are derived data that SQLite generates
from the body, which keeps the per-entry work of `verify` to one hash over bytes SQLite
hands over without decoding. The first entry links to a genesis hash derived from the log's
random id, so entries cannot be transplanted between logs.
"""

from __future__ import annotations

import hashlib
import struct


CHAIN_VERSION = b"policyc.audit.chain/v1"

# Index columns that queries and reports read; SQLite generates them from the body
# (`store.INDEX_PATHS`).
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

_pack_seq = struct.Struct(">Q").pack


def genesis(log_id: str) -> bytes:
    """The hash the first entry links to."""
    return hashlib.sha256(CHAIN_VERSION + b"\x00genesis\x00" + log_id.encode()).digest()


def digest(prev: bytes, seq: int, body: bytes) -> bytes:
    """The hash of one entry."""
    return hashlib.sha256(prev + _pack_seq(seq) + body).digest()
