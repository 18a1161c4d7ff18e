"""The front end: parse each file and give its top-level blocks their meaning.

Files are independent until names resolve, so a large compile splits them across
processes: forked workers claim files from the front of the list while this process
claims them from the back, until they meet, so a process slowed by other load simply
takes fewer files. A worker's answer is mostly lowered declarations; they travel as
JSON through one pydantic adapter (Rust on both ends: about a third of the cost of
pickling the models, measured on 2,000 contracts), the rest — policy blocks, which lower
only once every file's headers and tenants are known, and diagnostics — as pickle.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Sequence

from pydantic import TypeAdapter

from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, did_you_mean, error
from policyc.dsl.parser import parse
from policyc.dsl.source import Source

from .breakers import lower_breaker
from .bundle import Breaker, Contract, GpuClass, HeaderMapping, RequestRule, Tenant
from .catalog import lower_gpu
from .contracts import lower_contract
from .gc_pause import gc_paused
from .requests import lower_request, lower_tenants

TOP_LEVEL = ("contract", "gpu", "request", "tenants", "policy", "breaker")

# Below this much source, worker processes cost more to start than they save.
PARALLEL_MIN_BYTES = 1_000_000


@dataclass
class Lowered:
    """Declarations in their bundle form, gathered from one file or from all of them."""

    contracts: list[Contract] = field(default_factory=list)
    gpus: list[GpuClass] = field(default_factory=list)
    headers: list[HeaderMapping] = field(default_factory=list)
    tenants: list[Tenant] = field(default_factory=list)
    rules: list[RequestRule] = field(default_factory=list)
    breakers: list[Breaker] = field(default_factory=list)

    def extend(self, other: "Lowered") -> None:
        for name in ("contracts", "gpus", "headers", "tenants", "rules", "breakers"):
            getattr(self, name).extend(getattr(other, name))


@dataclass
class FileUnit:
    """What the front end makes of one file: its lowered declarations, its (still
    unlowered) policy blocks and its diagnostics."""

    lowered: Lowered
    policies: list[ast.Block]
    diagnostics: list[Diagnostic]


def front_end(sources: Sequence[Source]) -> list[FileUnit]:
    """Every file's unit, in the order given. Large inputs are split across forked
    workers, unless forking is unsafe: a process with other threads (a server, a test
    harness) is never forked."""
    size = sum(len(s.text) for s in sources)
    workers = min(len(os.sched_getaffinity(0)), 4, len(sources))
    if size < PARALLEL_MIN_BYTES or workers < 2 or threading.active_count() > 1:
        return [front_end_file(s) for s in sources]
    return _in_parallel(list(sources), workers - 1)


def _in_parallel(sources: list[Source], helpers: int) -> list[FileUnit]:
    parse(Source("<warm-up>", ""))  # build the parser once, here, for the workers to inherit
    ctx = multiprocessing.get_context("fork")
    bounds = ctx.Array("i", [0, len(sources)])  # [next from the front, one past the next from the back]
    procs, conns = [], []
    for _ in range(helpers):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(sources, bounds, send), daemon=True)
        proc.start()
        send.close()
        procs.append(proc)
        conns.append(receive)
    units: dict[int, FileUnit] = {}
    while (i := _claim(bounds, from_front=False)) is not None:
        units[i] = front_end_file(sources[i])
    for proc, conn in zip(procs, conns):
        try:
            indices, packed = conn.recv()
            units.update(zip(indices, _unpack(packed)))
        except (EOFError, OSError, TypeError):  # a worker that died: its files are done below
            pass
        conn.close()
        proc.join()
    return [units[i] if i in units else front_end_file(s) for i, s in enumerate(sources)]


def _claim(bounds, *, from_front: bool) -> int | None:
    with bounds.get_lock():
        lo, hi = bounds[0], bounds[1]
        if lo >= hi:
            return None
        if from_front:
            bounds[0] = lo + 1
            return lo
        bounds[1] = hi - 1
        return hi - 1


def _worker(sources: list[Source], bounds, out: Connection) -> None:
    """In a forked worker: claim files from the front, send back their units."""
    try:
        indices, units = [], []
        while (i := _claim(bounds, from_front=True)) is not None:
            indices.append(i)
            units.append(front_end_file(sources[i]))
        out.send((indices, _pack(units)))
    finally:
        out.close()


def front_end_file(src: Source) -> FileUnit:
    """Parse one file and lower its top-level blocks (policies excepted)."""
    with gc_paused():
        diags: list[Diagnostic] = []
        tree, more = parse(src)
        diags.extend(more)
        low, policies = Lowered(), list[ast.Block]()
        if tree is not None:
            _lower_file(tree, low, policies, diags)
        return FileUnit(low, policies, diags)


def _lower_file(tree: ast.File, low: Lowered, policies: list[ast.Block], diags: list[Diagnostic]) -> None:
    for item in tree.items:
        if isinstance(item, ast.Field):
            diags.append(error("E213", f"`{item.key}:` must be inside a block", item.key_span,
                               f"top-level blocks: {', '.join(TOP_LEVEL)}"))
            continue
        kind = item.kind
        if kind == "contract":
            if (c := lower_contract(item, diags)) is not None:
                low.contracts.append(c)
        elif kind == "gpu":
            if (g := lower_gpu(item, diags)) is not None:
                low.gpus.append(g)
        elif kind == "request":
            low.headers.extend(lower_request(item, diags))
        elif kind == "tenants":
            low.tenants.extend(lower_tenants(item, diags))
        elif kind == "policy":
            policies.append(item)
        elif kind == "breaker":
            if (b := lower_breaker(item, diags)) is not None:
                low.breakers.append(b)
        else:
            diags.append(error("E214", f"unknown block `{kind}`", item.kind_span,
                               did_you_mean(kind, TOP_LEVEL) or f"top-level blocks: {', '.join(TOP_LEVEL)}"))


_WIRE = TypeAdapter(list[Lowered])


def _pack(units: list[FileUnit]) -> tuple[bytes, bytes]:
    """Units for the trip back: declarations as JSON, the rest as pickle."""
    with gc_paused():
        rest = [(u.policies, u.diagnostics) for u in units]
        return _WIRE.dump_json([u.lowered for u in units]), pickle.dumps(rest, protocol=5)


def _unpack(packed: tuple[bytes, bytes]) -> list[FileUnit]:
    declarations, rest = packed
    with gc_paused():
        lowered = _WIRE.validate_json(declarations)
        return [FileUnit(low, policies, diags) for low, (policies, diags) in zip(lowered, pickle.loads(rest))]


__all__ = ["FileUnit", "Lowered", "PARALLEL_MIN_BYTES", "TOP_LEVEL", "front_end", "front_end_file"]
