"""`policyc audit export`: individual decisions and acts, with their accounting, out of the
log, streamed (bounded memory at any size) as JSON lines, CSV or Parquet.

Each row is one entry: its chain position (`seq`, `segment`, `prev_hash`, `hash`) and its
stored `body` byte for byte, so any sampled row can be re-hashed on its own and proven
against an anchor (`record_proof.py`, `policyc audit verify --record`); and, for reading
without parsing the body, the entry's index fields and every accounting figure flattened
as three columns: `<figure>` (the value), `<figure>_kind` (measured / apportioned /
estimated) and `<figure>_source` (what measured or estimated it). The figures are the
fields of `records.Resources`, and those of any other group of figures a record carries
(`llm`: an LLM call's tokens and token times, as `llm_prompt_tokens`, ...), read from the
record models when the export starts: a figure added later becomes three more columns with
no change here.

Parquet goes through pyarrow, an optional extra (`pip install 'policyc[parquet]'`); without
it the export says so in one line.
"""

from __future__ import annotations

import csv
import io
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import msgspec

from pydantic import BaseModel

from .errors import AuditInputError
from .records import ActionRecord, DecisionRecord, Figure, Resources
from .segments import closed_segments
from .store import connect_reader, segment_base

FORMATS: tuple[str, ...] = ("jsonl", "csv", "parquet")


def _figure_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every Figure field under `model` (groups of figures followed one level
    down, e.g. ("llm", "prompt_tokens"))."""
    out: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        kinds = [a for a in getattr(info.annotation, "__args__", (info.annotation,)) if isinstance(a, type)]
        if Figure in kinds:
            out.append((*prefix, name))
        elif not prefix:
            for a in kinds:
                if issubclass(a, BaseModel):
                    out += _figure_paths(a, (*prefix, name))
    return out


def _groups() -> list[str]:
    """Top-level fields of the record models, other than `resources`, that group figures."""
    names: list[str] = []
    for model in (DecisionRecord, ActionRecord):
        for name, info in model.model_fields.items():
            kinds = [a for a in getattr(info.annotation, "__args__", (info.annotation,)) if isinstance(a, type)]
            if name != "resources" and name not in names and any(issubclass(a, BaseModel) and _figure_paths(a) for a in kinds):
                names.append(name)
    return names


def _group_model(name: str) -> type[BaseModel]:
    for model in (DecisionRecord, ActionRecord):
        info = model.model_fields.get(name)
        if info is not None:
            for a in getattr(info.annotation, "__args__", (info.annotation,)):
                if isinstance(a, type) and issubclass(a, BaseModel):
                    return a
    raise KeyError(name)


GROUPS: tuple[str, ...] = tuple(_groups())
# (field of the record, path inside it): ("resources", "gpu_seconds"), ("llm", "prompt_tokens"), ...
FIGURE_PATHS: tuple[tuple[str, ...], ...] = tuple([("resources", *p) for p in _figure_paths(Resources)]
                                                  + [(g, *p) for g in GROUPS for p in _figure_paths(_group_model(g))])
FIGURES: tuple[str, ...] = tuple("_".join(p[1:]) if p[0] == "resources" else "_".join(p) for p in FIGURE_PATHS)
INDEX_FIELDS: tuple[str, ...] = ("seq", "segment", "kind", "time", "decision_id", "tenant", "model", "region", "outcome", "action")
# a rejection's refusing rules (`DecisionRecord.rejected_by`): "id (file:line)", "; "-separated; empty otherwise
RULE_FIELDS: tuple[str, ...] = ("rejected_by",)
CHAIN_FIELDS: tuple[str, ...] = ("prev_hash", "hash", "body")
PARQUET_HINT = "Parquet export needs pyarrow: pip install 'policyc[parquet]' (or pip install pyarrow)"
_BATCH = 10_000


# The parts of a record the export flattens; msgspec skips the rest without building it
# (a third of orjson's time per record here). A Raw cannot be in a union: `null` is the default.
_Body = msgspec.defstruct("_Body", [(name, msgspec.Raw, msgspec.Raw(b"null")) for name in ("resources", *GROUPS, *RULE_FIELDS)],
                          gc=False)
_DECODE = msgspec.json.Decoder(_Body).decode
_PARTS = ("resources", *GROUPS)
# per part: (path inside it, value column, kind column, source column) of each figure
_PLAN: tuple[tuple[str, tuple[tuple[tuple[str, ...], str, str, str], ...]], ...] = tuple(
    (part, tuple((path[1:], f, f"{f}_kind", f"{f}_source") for path, f in zip(FIGURE_PATHS, FIGURES) if path[0] == part)) for part in _PARTS)
_ABSENT: dict[str, dict[str, None]] = {part: {c: None for _, *cols in subs for c in cols} for part, subs in _PLAN}


def columns() -> list[str]:
    """The export's columns, in order."""
    figs = [c for f in FIGURES for c in (f, f"{f}_kind", f"{f}_source")]
    return [*INDEX_FIELDS, *RULE_FIELDS, *figs, *CHAIN_FIELDS]


@dataclass(frozen=True, slots=True)
class ExportStats:
    rows: int
    decisions: int
    actions: int


def _files(log: Path) -> list[Path]:
    out = [p for _, p in closed_segments(log)]
    if log.is_file():
        out.append(log)
    if not out:
        connect_reader(log)  # raises the usual "no audit log here"
    return out


def rows(log: str | os.PathLike[str], start: float | None = None, end: float | None = None) -> Iterator[dict[str, Any]]:
    """Every entry with start <= time < end, in chain order across segments, as export rows."""
    if start is not None and end is not None and end < start:
        raise AuditInputError(f"time range is empty: --to ({end}) is before --from ({start})")
    where, args = [], []
    if start is not None:
        where.append("time >= ?")
        args.append(start)
    if end is not None:
        where.append("time < ?")
        args.append(end)
    sql = ("SELECT seq, kind, time, decision_id, tenant, model, region, outcome, action, prev_hash, hash, body FROM entries"
           + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY seq")
    for path in _files(Path(log)):
        conn = connect_reader(path)
        try:
            segment = segment_base(conn)[0]
            cur = conn.execute(sql, args)
            while batch := cur.fetchmany(2048):
                for r in batch:
                    yield _row(segment, r)
        except sqlite3.DatabaseError as e:
            raise AuditInputError(f"{path}: cannot read entries ({e}); run `policyc audit verify`") from None
        finally:
            conn.close()


def _row(segment: int, r: tuple[Any, ...]) -> dict[str, Any]:
    seq, kind, t, did, tenant, model, region, outcome, action, prev, h, body = r
    try:
        text = bytes(body).decode()
        decoded = _DECODE(body)
        parts = {name: msgspec.json.decode(memoryview(getattr(decoded, name))) for name in _PARTS}
        refusing = msgspec.json.decode(memoryview(getattr(decoded, "rejected_by")))  # noqa: B009 - a field of a defstruct
    except (UnicodeDecodeError, msgspec.DecodeError, RecursionError):
        raise AuditInputError(f"entry {seq}: its body is not an audit record; run `policyc audit verify`") from None
    out: dict[str, Any] = {"seq": seq, "segment": segment, "kind": kind, "time": t, "decision_id": did, "tenant": tenant, "model": model,
                           "region": region, "outcome": outcome, "action": action, "rejected_by": _rules_text(refusing)}
    for part, subs in _PLAN:
        d = parts[part]
        if not isinstance(d, dict):
            out.update(_ABSENT[part])  # no figure of this part in the record (most records: no `llm`)
            continue
        for sub, c, ck, cs in subs:
            fig: Any = d
            for name in sub:
                fig = fig.get(name) if isinstance(fig, dict) else None
            if isinstance(fig, dict):
                out[c], out[ck], out[cs] = fig.get("value"), fig.get("source"), fig.get("method")
            else:
                out[c] = out[ck] = out[cs] = None
    out["prev_hash"], out["hash"], out["body"] = bytes(prev).hex(), bytes(h).hex(), text
    return out


def _rules_text(refusing: Any) -> str | None:
    """`rejected_by` as one cell: "rule id (file:line)" per rule, "; "-separated."""
    if not isinstance(refusing, list) or not refusing:
        return None
    out = []
    for r in refusing:
        if isinstance(r, dict):
            o = r.get("origin")
            out.append(f"{r.get('id')} ({o.get('file')}:{o.get('line')})" if isinstance(o, dict) else str(r.get("id")))
    return "; ".join(out) or None


def export(log: str | os.PathLike[str], fmt: str, out: IO[bytes] | str | os.PathLike[str], *, start: float | None = None,
           end: float | None = None) -> ExportStats:
    """Write the rows of `rows(log, start, end)` to `out` (a binary stream, or a path for
    any format) as `fmt`. Parquet needs a path or a seekable stream."""
    if fmt not in FORMATS:
        raise AuditInputError(f"unknown export format `{fmt}`: choose one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise AuditInputError(PARQUET_HINT) from None
    it = rows(log, start, end)
    counts = [0, 0, 0]

    def counted() -> Iterator[dict[str, Any]]:
        for r in it:
            counts[0] += 1
            counts[1 if r["kind"] == "decision" else 2] += 1
            yield r

    if isinstance(out, (str, os.PathLike)):
        with open(out, "wb") as f:
            _WRITERS[fmt](counted(), f)
    else:
        _WRITERS[fmt](counted(), out)
    return ExportStats(*counts)


def _jsonl(items: Iterator[dict[str, Any]], out: IO[bytes]) -> None:
    buf: list[bytes] = []
    for r in items:
        buf.append(msgspec.json.encode(r))
        if len(buf) >= _BATCH:
            out.write(b"\n".join(buf) + b"\n")
            buf.clear()
    if buf:
        out.write(b"\n".join(buf) + b"\n")


def _csv(items: Iterator[dict[str, Any]], out: IO[bytes]) -> None:
    text = io.TextIOWrapper(out, encoding="utf-8", newline="")
    w = csv.DictWriter(text, fieldnames=columns(), lineterminator="\n")
    w.writeheader()
    for r in items:
        w.writerow(r)
    text.flush()
    text.detach()


def parquet_schema() -> Any:
    import pyarrow as pa

    types: dict[str, Any] = {"seq": pa.int64(), "segment": pa.int32(), "time": pa.float64()}
    for f in FIGURES:
        types[f] = pa.float64()
    return pa.schema([(c, types.get(c, pa.string())) for c in columns()])


def _parquet(items: Iterator[dict[str, Any]], out: IO[bytes]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema()
    names = schema.names
    with pq.ParquetWriter(out, schema, compression="zstd") as writer:
        batch: list[dict[str, Any]] = []
        for r in items:
            batch.append(r)
            if len(batch) >= _BATCH:
                writer.write_table(pa.Table.from_pydict({c: [b[c] for b in batch] for c in names}, schema=schema))
                batch.clear()
        if batch:
            writer.write_table(pa.Table.from_pydict({c: [b[c] for b in batch] for c in names}, schema=schema))


_WRITERS = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet}


def read(path: str | os.PathLike[str], fmt: str | None = None) -> Iterator[dict[str, Any]]:
    """The rows of an export file (format from `fmt` or the file's extension), typed as
    `rows` yields them: for round-trip checks and for proving a sampled record."""
    p = Path(path)
    fmt = fmt or {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}.get(p.suffix.lower())
    if fmt not in FORMATS:
        raise AuditInputError(f"{p}: cannot tell the export's format from its name: use .jsonl, .csv or .parquet")
    try:
        if fmt == "jsonl":
            with open(p, "rb") as f:
                for line in f:
                    if line.strip():
                        yield msgspec.json.decode(line)
        elif fmt == "csv":
            with open(p, encoding="utf-8", newline="") as f:
                for r in csv.DictReader(f):
                    yield _typed_csv(r)
        else:
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise AuditInputError(PARQUET_HINT) from None
            for batch in pq.ParquetFile(p).iter_batches(batch_size=_BATCH):
                yield from batch.to_pylist()
    except OSError as e:
        raise AuditInputError(f"{p}: cannot read the export: {e.strerror}") from None
    except (ValueError, KeyError) as e:
        raise AuditInputError(f"{p}: not a policyc audit export ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _typed_csv(r: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {k: (v if v != "" else None) for k, v in r.items()}
    out["seq"], out["segment"] = int(r["seq"]), int(r["segment"])
    out["time"] = float(r["time"]) if r["time"] else None
    for f in FIGURES:
        out[f] = float(r[f]) if r.get(f) else None
    return out
