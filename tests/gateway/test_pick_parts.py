"""`benchmarks/pick_parts.py` (`benchmarks/gateway.py --parts`): the wrappers count every call
and the CPU inside it on the calling thread, nest as the pick's parts do (the pick holds the
decision service, which holds the placer's place and the audit record), pass results and
exceptions through unchanged, and the collector's passes are counted."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

PARTS = Path(__file__).resolve().parents[2] / "benchmarks" / "pick_parts.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pick_parts", PARTS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _spin(n: int = 20_000) -> int:
    return sum(i * i for i in range(n))  # some CPU on this thread


class _Placer:
    def place(self, x: int) -> int:
        _spin()
        return x + 1


class _Audit:
    def record(self, x: int) -> None:
        _spin()
        if x < 0:
            raise ValueError("refused")


def test_parts_nest_count_and_pass_through() -> None:
    mod = _module()
    placer, audit = _Placer(), _Audit()

    def decide_shape(x: int) -> int:
        _spin()
        audit.record(x)
        return placer.place(x)

    async def request_headers(x: int) -> int:
        _spin()
        return service.decide_shape(x)

    service = SimpleNamespace(decide_shape=decide_shape)
    picker: Any = SimpleNamespace(_request_headers=request_headers, service=service)
    parts = mod.PickParts(picker, placer, audit)
    try:
        before = parts.snapshot()
        assert [asyncio.run(picker._request_headers(i)) for i in range(5)] == [1, 2, 3, 4, 5]
        with pytest.raises(ValueError, match="refused"):  # an exception passes through, the call still counted
            asyncio.run(picker._request_headers(-1))
        gc.collect(0)
        after = parts.snapshot()
        pick, place, record, decide = (after[i] - before[i] for i in range(4))
        assert after[4] - before[4] == 6
        assert parts.place.calls == 5 and parts.audit.calls == 6 and parts.decide.calls == 6
        assert 0 < place and 0 < record and place + record <= decide <= pick
        assert after[8] - before[8] >= 1  # a generation-0 pass
        line = mod.PickParts.line(before, after, 6, 0.01, 0.012, 0.001, 0.005, 0.006, 6)
        assert "the pick" in line and "the placer's place" in line and "garbage collection" in line
    finally:
        parts.gc.close()
    assert parts.gc._hook not in gc.callbacks
