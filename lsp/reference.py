"""Field meanings for hover and completion, read from the language reference's tables
(docs/language.md, package data): one source of truth for people and the editor."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class FieldDoc:
    field: str
    block: str  # the section or block it belongs to, as the reference names it ("" when none)
    text: str  # the rest of the row: its value, unit, whether required


def reference_path() -> Path:
    import policyc

    return Path(policyc.__file__).resolve().parent / "docs" / "language.md"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


@lru_cache(maxsize=1)
def field_docs() -> dict[str, tuple[FieldDoc, ...]]:
    """{field name: its rows}, from every table of the reference that has a `field` column."""
    try:
        text = reference_path().read_text(encoding="utf-8")
    except OSError:
        return {}
    out: dict[str, list[FieldDoc]] = {}
    header: list[str] | None = None
    block = ""
    heading = ""
    for line in text.splitlines():
        if line.startswith("## "):
            heading = re.sub(r"\s*\(`[^`]*`\)\s*$", "", line[3:]).strip()
            header = None
            continue
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            block = ""
            continue
        if all(set(c) <= set("-: ") for c in cells) or "field" not in header:
            continue
        fi = header.index("field")
        if fi > 0 and cells[0]:
            block = cells[0].strip("`")
        rest = "; ".join(f"{h}: {c}" for h, c in zip(header, cells) if h not in ("field", header[0] if fi > 0 else "") and c)
        where = block or heading
        for name in re.findall(r"`([a-z_][a-z0-9_]*)`", cells[fi] if fi < len(cells) else ""):
            out.setdefault(name, []).append(FieldDoc(name, where, rest.replace("\\|", "|")))
    return {k: tuple(v) for k, v in out.items()}
