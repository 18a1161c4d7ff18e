"""The emulator against real vLLM on this machine, at the same load, side by side: time to
first token (short and long prompts), one stream's tokens per second, and output tokens
per second at concurrency 8 and 32; then the timing model those vLLM figures imply.

    .venv/bin/python benchmarks/emulator_calibration.py [--quick] [--emulator-only]

One vLLM instance (the project's tiny model, `.venv-vllm`) and one emulator instance with
the default `TimingModel`, measured one after the other with the same client (aiohttp,
streamed completions, `ignore_eos`, exact `max_tokens`). Fitted from vLLM's figures: the
step time at one and at 32 sequences gives `step_s` and `decode_s_per_seq`; the TTFT
difference between the long and the short prompt over their token difference gives
`prefill_s_per_token`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

SHORT = "def add(a, b):\n    return a + b\n"  # ~15 tokens
LONG = "".join(f"result_{i} = compute(value_{i}, scale={i % 7})\n" for i in range(50))  # ~830 tokens


async def one(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> tuple[float, float, int, int]:
    """(ttft_s, total_s, output chunks, prompt tokens) of one streamed completion."""
    t = time.monotonic()
    first = None
    chunks = 0
    usage_prompt = 0
    async with session.post(url + "/v1/completions", json={
            "model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                usage_prompt = obj["usage"]["prompt_tokens"]
            if obj["choices"] and obj["choices"][0].get("text"):
                chunks += 1
                if first is None:
                    first = time.monotonic() - t
    return first or 0.0, time.monotonic() - t, chunks, usage_prompt


async def measure(url: str, quick: bool) -> dict[str, float]:
    reps = 5 if quick else 15
    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as s:
        await one(s, url, SHORT, 4)  # warm
        short = [await one(s, url, SHORT, 1) for _ in range(reps)]
        long = [await one(s, url, f"# run {i}\n" + LONG, 1) for i in range(reps)]  # a new head each time: no prefix-cache hit
        out["prompt_tokens_short"] = short[0][3]
        out["prompt_tokens_long"] = long[0][3]
        out["ttft_short_ms"] = statistics.median(x[0] for x in short) * 1000
        out["ttft_long_ms"] = statistics.median(x[0] for x in long) * 1000
        n = 100 if quick else 200
        single = await one(s, url, SHORT, n)
        out["tokens_per_s_1"] = single[2] / (single[1] - single[0])
        for c in (8, 32):
            t = time.monotonic()
            res = await asyncio.gather(*(one(s, url, SHORT + f"# {i}\n", 64 if quick else 128) for i in range(c)))
            wall = time.monotonic() - t
            out[f"tokens_per_s_{c}"] = sum(r[2] for r in res) / wall
            out[f"ttft_p50_ms_c{c}"] = statistics.median(r[0] for r in res) * 1000
    return out


def fit(v: dict[str, float]) -> dict[str, float]:
    t1 = 1 / v["tokens_per_s_1"]
    t32 = 32 / v["tokens_per_s_32"]
    per_seq = max((t32 - t1) / 31, 0.0)
    prefill = max((v["ttft_long_ms"] - v["ttft_short_ms"]) / 1000 / max(v["prompt_tokens_long"] - v["prompt_tokens_short"], 1), 0.0)
    return {"step_s": round(max(t1 - per_seq, 0.0), 6), "decode_s_per_seq": round(per_seq, 7), "prefill_s_per_token": round(prefill, 8)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--emulator-only", action="store_true")
    args = ap.parse_args()

    from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec
    from policyc.modelserver.llm_model import cached_llm_model
    from policyc.modelserver.vllm_engine import VllmServer, VllmSpec

    model = cached_llm_model()
    rows: dict[str, dict[str, float]] = {}
    if not args.emulator_only:
        with tempfile.TemporaryDirectory() as d:
            server = VllmServer(VllmSpec(model.dir, model.name, cpu_bind="auto"), Path(d))
            server.spawn()
            try:
                server.wait_ready()
                rows["vllm"] = asyncio.run(measure(f"http://{server.endpoint}", args.quick))
            finally:
                server.stop()
    with EmulatorServer([EmulatorSpec(model.name, model.dir)]) as emu:
        rows["emulator"] = asyncio.run(measure(f"http://{emu.endpoints[0]}", args.quick))
    keys = list(next(iter(rows.values())))
    print(f"{'figure':<22}" + "".join(f"{k:>12}" for k in rows) + ("   emulator/vllm" if len(rows) == 2 else ""))
    for k in keys:
        cells = "".join(f"{rows[r][k]:>12.1f}" for r in rows)
        ratio = f"   {rows['emulator'][k] / rows['vllm'][k]:.2f}" if len(rows) == 2 and rows["vllm"][k] else ""
        print(f"{k:<22}{cells}{ratio}")
    if "vllm" in rows:
        print("timing model fitted to vLLM:", json.dumps(fit(rows["vllm"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
