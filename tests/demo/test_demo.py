"""The README's main job: `policyc demo` runs end to end and stops cleanly."""

from __future__ import annotations

import io
from pathlib import Path

from policyc.server.demo import run_demo


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_demo(out, tmp_path) == 0
    text = out.getvalue()
    for expected in (
        "ONNX model missing a contract section → INVALID_ARGUMENT",
        "`mars-1` is not a declared value of `request.region`",
        "INVALID_ARGUMENT  header `X-SLO-Latency`: `fast` is not a time",
        "watermark pinned at 89 %", "placement changed:",
        "action: cancel_stream", "x-retry-count': '1'", "retry 1",
        "self_heal_step  gpu_reset", "dry_run", "EXPLAIN", "demo finished",
        "ADMITTED  recommender →", "`catalog-api` → http-us-west (direct,",
        "ADMITTED  support-chatbot →", "`conversation-store` → host-", "/nvme (local, 3.20 ms ≤ 4 ms)",
    ):
        assert expected in text, expected
    assert (tmp_path / "audit.db").exists()
