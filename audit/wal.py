"""Reading SQLite's write-ahead log to find a torn or unfinished tail after a crash.

SQLite already refuses to use WAL frames that fail their checksum or that follow the last
commit frame, so a torn last write never corrupts committed records. What it does not do is
*tell* anyone. Operators and auditors want to know that a crash cut a write short and that
it was repaired, so the log inspects the WAL file itself (format: sqlite.org/fileformat.html
section 4) before SQLite opens it, reports what will be discarded, and records the repair.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

_MAGIC_LE, _MAGIC_BE = 0x377F0682, 0x377F0683
_HEADER = 32
_FRAME_HEADER = 24
_MASK = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class WalTail:
    """What the WAL holds beyond its last commit. `torn_bytes` counts bytes of frames that
    SQLite will discard: a partial frame, a frame failing its checksum, or whole frames of
    a transaction whose commit frame was never written."""

    committed_frames: int
    uncommitted_frames: int
    torn_bytes: int
    reason: str

    @property
    def torn(self) -> bool:
        return self.torn_bytes > 0


CLEAN = WalTail(0, 0, 0, "no write-ahead log")


def _checksum(data: bytes, big_endian: bool, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & _MASK
        s1 = (s1 + words[i + 1] + s0) & _MASK
    return s0, s1


def inspect_wal(db_path: str | Path) -> WalTail:
    """Walk `<db>-wal` and classify its tail. Stale frames of an earlier WAL generation
    (other salts) are normal leftovers, not damage."""
    wal = Path(f"{db_path}-wal")
    try:
        data = wal.read_bytes()
    except FileNotFoundError:
        return CLEAN
    if len(data) == 0:
        return WalTail(0, 0, 0, "empty write-ahead log")
    if len(data) < _HEADER:
        return WalTail(0, 0, len(data), f"write-ahead log header cut short ({len(data)} of {_HEADER} bytes)")
    magic, _version, page_size, _ckpt, salt1, salt2, c1, c2 = struct.unpack(">8I", data[:_HEADER])
    if magic not in (_MAGIC_LE, _MAGIC_BE) or page_size < 512 or page_size & (page_size - 1):
        return WalTail(0, 0, len(data), "write-ahead log header is not valid")
    big = magic == _MAGIC_BE
    s0, s1 = _checksum(data[:24], big, 0, 0)
    if (s0, s1) != (c1, c2):
        return WalTail(0, 0, len(data), "write-ahead log header fails its checksum")
    frame = _FRAME_HEADER + page_size
    pos, committed_end, committed, pending = _HEADER, _HEADER, 0, 0
    end, reason = len(data), ""
    while pos < len(data):
        if pos + frame > len(data):
            reason = f"last frame cut short ({len(data) - pos} of {frame} bytes)"
            break
        _pgno, commit, f1, f2, fc1, fc2 = struct.unpack(">6I", data[pos : pos + _FRAME_HEADER])
        if (f1, f2) != (salt1, salt2):
            end = pos  # an older generation's frames: the current WAL ends here
            break
        s0, s1 = _checksum(data[pos : pos + 8], big, s0, s1)
        s0, s1 = _checksum(data[pos + _FRAME_HEADER : pos + frame], big, s0, s1)
        if (s0, s1) != (fc1, fc2):
            end, reason = pos + frame, "a frame fails its checksum (torn write)"
            break
        pos += frame
        pending += 1
        if commit:
            committed, pending, committed_end = committed + pending, 0, pos
    if not reason and pending:
        end, reason = min(end, pos), "a transaction has no commit frame (interrupted write)"
    if not reason:
        return WalTail(committed, 0, 0, "clean")
    return WalTail(committed, pending, end - committed_end, reason)
