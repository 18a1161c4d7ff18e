"""Segments: a log that grows without bound is cut into closed files and one live file.

`policyc audit rotate` (or `AuditLog.rotate`) seals the live file with a signed close record,
moves it to `<log>.segments/NNNNNN.db` and starts a new live file at `<log>` whose first
entry continues the same chain: seq numbering goes on, and the new file's `meta` names the
entry it follows (`base_seq`, `base_hash`), which its signed opening checkpoint seals again.
`verify` walks the closed segments in order, then the live file, and checks each joint.

Retention (`--retain`) removes the oldest closed segments, but first appends to
`<log>.segments/pruned.json` what an auditor needs to prove the gap: each removed segment's
seq and time range and its signed close record (the checkpoint of its last entry, whose
`SEQ:HASH` is the anchor the next segment must start from). Nothing else of a removed
segment is kept: its records are gone, and the report says so.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import AuditInputError
from .store import fsync_dir

if TYPE_CHECKING:  # the writer process imports this module and never loads pydantic
    from .checkpoints import Checkpoint

_SEGMENT = re.compile(r"^(\d{6,})\.db$")
PRUNED = "pruned.json"


def segments_dir(log: str | os.PathLike[str]) -> Path:
    """Where the closed segments of the log at `log` live."""
    return Path(f"{os.fspath(log)}.segments")


def segment_path(log: str | os.PathLike[str], number: int) -> Path:
    return segments_dir(log) / f"{number:06d}.db"


def closed_segments(log: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(number, path) of each closed segment still present, oldest first."""
    d = segments_dir(log)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _SEGMENT.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def files(log: str | os.PathLike[str]) -> list[Path]:
    """Every file of the log in chain order: closed segments, then the live file (if any)."""
    out = [p for _, p in closed_segments(log)]
    live = Path(log)
    if live.is_file():
        out.append(live)
    return out


@dataclass(frozen=True, slots=True)
class PrunedSegment:
    """What is kept of a segment removed by retention: enough to prove the gap."""

    segment: int
    first_seq: int
    last_seq: int
    first_time: float | None
    last_time: float | None
    close: Checkpoint  # its signed close record, at `last_seq`
    pruned_at: float

    def to_json(self) -> dict[str, object]:
        return {"segment": self.segment, "first_seq": self.first_seq, "last_seq": self.last_seq, "first_time": self.first_time,
                "last_time": self.last_time, "close": self.close.model_dump(mode="json"), "pruned_at": self.pruned_at,
                "anchor": f"{self.close.seq}:{self.close.hash}"}


def pruned(log: str | os.PathLike[str]) -> list[PrunedSegment]:
    """The removed segments' records, oldest first (empty when none was removed). Raises
    AuditInputError naming the file when it is not what retention writes."""
    from pydantic import ValidationError

    from .checkpoints import Checkpoint

    p = segments_dir(log) / PRUNED
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise AuditInputError(f"{p}: cannot read the record of pruned segments ({e})") from None
    out = []
    try:
        for item in raw["segments"]:
            out.append(PrunedSegment(int(item["segment"]), int(item["first_seq"]), int(item["last_seq"]), item.get("first_time"),
                                     item.get("last_time"), Checkpoint.model_validate(item["close"]), float(item["pruned_at"])))
    except (KeyError, TypeError, ValueError, ValidationError) as e:
        raise AuditInputError(f"{p}: not a record of pruned segments ({str(e).splitlines()[0]})") from None
    return sorted(out, key=lambda s: s.segment)


def record_pruned(log: str | os.PathLike[str], items: list[PrunedSegment]) -> None:
    """Append `items` to the pruned record, durably, before their files are removed."""
    p = segments_dir(log) / PRUNED
    kept = pruned(log)
    doc = {"schema": "policyc.audit.pruned/v1", "segments": [s.to_json() for s in [*kept, *items]]}
    tmp = p.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    fsync_dir(p.parent)
