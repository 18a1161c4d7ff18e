"""The front end: parse each file and give its top-level blocks their meaning.

Files are independent until names resolve, so a large compile splits them across
processes: forked workers take the first shares of the files while this process takes
the last, all at once. A worker's answer is mostly lowered declarations; they travel as
JSON through one pydantic adapter (Rust on both ends: about a third of the cost of
pickling the models, measured on 2,000 contracts), the rest — policy blocks, which lower
only once every file's headers and tenants are known, and diagnostics — as pickle.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

from pydantic import TypeAdapter
from pydantic.dataclasses import dataclass as pydantic_dataclass

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
    shares = _split(list(sources), workers)
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers - 1, mp_context=ctx) as pool:
        pending = [pool.submit(_front_end_packed, share) for share in shares[:-1]]
        mine = [front_end_file(s) for s in shares[-1]]
        theirs = [unit for p in pending for unit in _unpack(p.result())]
    return theirs + mine


def front_end_file(src: Source) -> FileUnit:
    """Parse one file and lower its top-level blocks (policies excepted)."""
    with gc_paused():
        diags: list[Diagnostic] = []
        tree, more = parse(src)
        diags.extend(more)
        low, policies = Lowered(), []
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


def _split(sources: list[Source], parts: int) -> list[list[Source]]:
    """Contiguous shares of about equal size; the last (this process's) a little smaller,
    since this process also decodes what the workers send."""
    total = sum(len(s.text) for s in sources)
    targets = [total * (k + 1) / (parts - 0.15) for k in range(parts - 1)]
    shares: list[list[Source]] = [[] for _ in range(parts)]
    done, k = 0, 0
    for s in sources:
        while k < parts - 1 and done >= targets[k]:
            k += 1
        shares[k].append(s)
        done += len(s.text)
    return shares


@pydantic_dataclass
class _Declarations:
    contracts: list[Contract]
    gpus: list[GpuClass]
    headers: list[HeaderMapping]
    tenants: list[Tenant]
    rules: list[RequestRule]
    breakers: list[Breaker]


_WIRE = TypeAdapter(list[_Declarations])


def _front_end_packed(sources: list[Source]) -> tuple[bytes, bytes]:
    """In a worker: the units of `sources`, declarations as JSON, the rest as pickle."""
    units = [front_end_file(s) for s in sources]
    with gc_paused():
        decls = [_Declarations(**vars(u.lowered)) for u in units]
        return _WIRE.dump_json(decls), pickle.dumps([(u.policies, u.diagnostics) for u in units], protocol=5)


def _unpack(packed: tuple[bytes, bytes]) -> list[FileUnit]:
    decls_json, rest = packed
    with gc_paused():
        decls = _WIRE.validate_json(decls_json)
        return [FileUnit(Lowered(**vars(d)), policies, diags) for d, (policies, diags) in zip(decls, pickle.loads(rest))]


__all__ = ["FileUnit", "Lowered", "PARALLEL_MIN_BYTES", "TOP_LEVEL", "front_end", "front_end_file"]
