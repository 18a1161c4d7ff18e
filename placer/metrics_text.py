"""Read the few figures the placer needs out of a model server's Prometheus text, fast.

vLLM's `/metrics` is about 600 lines and 50 KB; the placer needs eight of them, 20 times a
second, from every endpoint. A full exposition parser (prometheus_client's) costs
milliseconds per page in Python; this one looks each wanted sample name up with `bytes.find`
(C speed), reads only that family's contiguous lines, and parses labels only where a series
filters on them. The tests hold its figures equal to prometheus_client's parser on real vLLM
pages and on the emulator's.

    wanted = compile_map(protocol("vllm"))
    values, problems = read_figures(body, wanted)     # {"queue_depth": 0.0, ...}, ["…"]

A sample whose value is not a finite number is left out and named in `problems` (a NaN is
not a measurement); a key whose series is absent is absent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .server_metric_names import Agg, MetricMap, Series

MAX_BODY_BYTES = 4 * 1024 * 1024  # a page larger than this is refused, not read
_LABEL = re.compile(rb'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class _Want:
    key: str
    labels: tuple[tuple[bytes, bytes], ...]
    agg: Agg
    value_label: bytes | None


@dataclass(frozen=True, slots=True)
class CompiledMap:
    """A metric map grouped by sample name (bytes), ready for `read_figures`."""

    by_name: tuple[tuple[bytes, tuple[_Want, ...]], ...]


def compile_map(m: MetricMap) -> CompiledMap:
    groups: dict[bytes, list[_Want]] = {}
    for key, s in m.items():
        groups.setdefault(s.name.encode(), []).append(_want(key, s))
    return CompiledMap(tuple((n, tuple(w)) for n, w in groups.items()))


def _want(key: str, s: Series) -> _Want:
    return _Want(key, tuple((k.encode(), v.encode()) for k, v in s.labels), s.agg,
                 s.value_label.encode() if s.value_label else None)


def _first(body: bytes, name: bytes) -> int:
    """Where the first sample named exactly `name` starts (not a longer name it prefixes); -1: none."""
    n = len(name)
    if body.startswith(name) and body[n:n + 1] in (b"{", b" "):
        return 0
    at = body.find(b"\n" + name)
    while at >= 0:
        if body[at + 1 + n:at + 2 + n] in (b"{", b" "):
            return at + 1
        at = body.find(b"\n" + name, at + 1)
    return -1


def _family(body: bytes, name: bytes) -> list[tuple[bytes, bytes]]:
    """The (labels, value) of every sample named exactly `name`: the first line that
    starts with it, then the lines that follow it while they do (a family's samples are
    contiguous in the exposition format)."""
    n = len(name)
    pos = _first(body, name)
    if pos < 0:
        return []
    out: list[tuple[bytes, bytes]] = []
    size = len(body)
    while pos < size and body.startswith(name, pos) and body[pos + n:pos + n + 1] in (b"{", b" "):
        end = body.find(b"\n", pos)
        if end < 0:
            end = size
        line = body[pos + n:end]
        if line[:1] == b"{":
            close = line.rfind(b"}")
            labels, rest = (line[1:close], line[close + 1:]) if close > 0 else (b"", b"")
        else:
            labels, rest = b"", line
        value = rest.split(None, 1)[0] if rest.strip() else b""
        out.append((labels, value))
        pos = end + 1
    return out


def _labels(text: bytes) -> dict[bytes, bytes]:
    return dict(_LABEL.findall(text))


def read_figures(body: bytes, wanted: CompiledMap) -> tuple[dict[str, float], list[str]]:
    """The keys' figures in `body` (one Prometheus text page) and the problems met."""
    if len(body) > MAX_BODY_BYTES:
        return {}, [f"metrics page of {len(body):,} bytes; at most {MAX_BODY_BYTES:,} are read"]
    values: dict[str, float] = {}
    problems: list[str] = []
    for name, wants in wanted.by_name:
        samples = _family(body, name)
        if not samples:
            continue
        for w in wants:
            got: list[float] = []
            for labels_text, value_text in samples:
                if w.labels or w.value_label:
                    labels = _labels(labels_text)
                    if any(labels.get(k) != v for k, v in w.labels):
                        continue
                    if w.value_label is not None:
                        value_text = labels.get(w.value_label, b"")
                try:
                    v = float(value_text)
                except ValueError:
                    problems.append(f"{name.decode()}: `{value_text[:40].decode(errors='replace')}` is not a number")
                    continue
                if not math.isfinite(v):
                    problems.append(f"{name.decode()}: {v} is not a measurement")
                    continue
                got.append(v)
            if got:
                values[w.key] = sum(got) if w.agg is Agg.SUM else max(got)
    return values, problems


__all__ = ["CompiledMap", "MAX_BODY_BYTES", "compile_map", "read_figures"]
