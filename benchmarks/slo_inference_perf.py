"""The SLO attainment benchmark's pool and routers driven by `inference-perf` (the Gateway API
Inference Extension's benchmark tool) instead of benchmarks/slo_attainment.py's own client:
its TTFT percentiles and its own SLO attainment (it reads the `x-slo-ttft-ms` header it sends
and judges each streamed request's first token against it), router by router.

    /root/.pyenv/versions/3.12.1/bin/python -m venv /tmp/ipvenv && /tmp/ipvenv/bin/pip install inference-perf==0.7.0
    .venv/bin/python benchmarks/slo_inference_perf.py --inference-perf /tmp/ipvenv/bin/inference-perf \\
        --instances 32 --rate 12 --duration 20 --routers policyc,envoy-least-request

What inference-perf can and cannot replay here: it sends one set of headers for the whole run
(`api.headers`), so one run has one TTFT SLO (`--slo-ms`, default 300: the `mixed` trace's gold
tenant), not the three tenants of slo_attainment.py's trace file; its data is its own
`shared_prefix` generator (`--groups` system prompts of `--system-tokens` tokens, questions
and outputs drawn from its distributions, tokens counted with the tiny model's tokenizer from
`.venv-vllm/models/tiny-llama`), Poisson arrivals at `--rate` for `--duration` seconds, a fixed
seed, so every router gets the same requests. The pool is slo_attainment.py's (`pool_slots`,
`Pool`: emulators slowed by the catalog's bf16 peaks, restarted for each router) and so are
the routers (`start_router`, policyc's gateway at its defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import slo_attainment as slo  # noqa: E402 - the sibling benchmark's pool and routers

TOKENIZER = slo.REPO / ".venv-vllm" / "models" / "tiny-llama"


def config(url: str, args: argparse.Namespace, out: Path) -> str:
    """inference-perf's YAML (JSON is YAML) for one router."""
    return json.dumps({
        "api": {"type": "chat", "streaming": True, "headers": {"x-slo-ttft-ms": str(args.slo_ms)}},
        "data": {"type": "shared_prefix", "shared_prefix": {
            "num_groups": args.groups, "num_prompts_per_group": args.prompts_per_group,
            "system_prompt_len": args.system_tokens,
            "question_distribution": {"min": 15, "max": 500, "mean": 120, "std_dev": 120},
            "output_distribution": {"min": 16, "max": 64, "mean": 40, "std_dev": 14}}},
        "load": {"type": "poisson", "stages": [{"rate": args.rate, "duration": args.duration}], "num_workers": 2,
                 "worker_max_concurrency": 256, "base_seed": args.seed},
        "server": {"type": "vllm", "model_name": slo.MODEL, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(TOKENIZER)},
        "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": False,
                                         "percentiles": [50, 90, 99]},
                   # its SLO attainment ("goodput_percentage"): the share of requests whose TTFT met the SLO
                   "goodput": {"constraints": {"ttft": args.slo_ms / 1000}}},
        "storage": {"local_storage": {"path": str(out)}},
    })


def summary(out: Path) -> dict[str, Any]:
    """The figures of inference-perf's summary report that this benchmark compares (its whole
    report stays under `out`)."""
    found = sorted(out.rglob("summary_lifecycle_metrics.json"))
    if not found:
        raise RuntimeError(f"inference-perf wrote no summary_lifecycle_metrics.json under {out}")
    s = json.loads(found[-1].read_text())
    ok = s.get("successes") or {}
    ttft = (ok.get("latency") or {}).get("time_to_first_token") or {}
    good = ok.get("goodput_metrics") or {}
    return {"requests": (s.get("load_summary") or {}).get("count"), "succeeded": ok.get("count"),
            "failed": (s.get("failures") or {}).get("count"),
            "slo_attainment_pct": good.get("goodput_percentage"), "goodput_rps": good.get("request_goodput"),
            "ttft_ms": {q: round(1e3 * ttft[k], 1) for q, k in (("p50", "median"), ("p90", "p90"), ("p99", "p99")) if k in ttft},
            "output_tok_s": (ok.get("throughput") or {}).get("output_tokens_per_sec"), "report": str(found[-1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inference-perf", required=True, help="the inference-perf command (its own Python >= 3.12 venv)")
    ap.add_argument("--instances", type=int, default=32)
    ap.add_argument("--rate", type=float, default=12.0)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--slo-ms", type=int, default=300)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--prompts-per-group", type=int, default=40)
    ap.add_argument("--system-tokens", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--base-slowdown", type=float, default=10.0)
    ap.add_argument("--max-seqs", type=int, default=4)
    ap.add_argument("--routers", default="policyc,envoy-least-request")
    args = ap.parse_args()
    routers = [r for r in args.routers.split(",") if r]
    bad = [r for r in routers if r not in slo.ALL_ROUTERS]
    if bad:
        print(f"slo_inference_perf: unknown routers {bad}; known: {', '.join(slo.ALL_ROUTERS)}", file=sys.stderr)
        return 2
    if not TOKENIZER.exists():
        print(f"slo_inference_perf: {TOKENIZER} missing (the tiny model's tokenizer: scripts/setup.sh makes it)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="policyc-slo-ip-"))
    slots, bundle = slo.pool_slots(args.instances, args.base_slowdown)
    results = []
    for name in routers:
        why = slo.router_available(name)
        if why is not None:
            results.append({"router": name, "not_run": why})
            print(json.dumps(results[-1]), flush=True)
            continue
        pool = slo.Pool(slots, args.max_seqs)
        router: slo.Router | None = None
        try:
            router = slo.start_router(name, workdir, bundle, slots, pool.endpoints, 8)
            asyncio.run(slo.warm(router.url))
            out = workdir / name.replace(":", "-")
            cfg = workdir / f"{name.replace(':', '-')}.yml"
            cfg.write_text(config(router.url, args, out))
            t = time.monotonic()
            done = subprocess.run([args.inference_perf, "-c", str(cfg)], capture_output=True, text=True,
                                  timeout=args.duration * 10 + 120)
            if done.returncode != 0:
                raise RuntimeError(f"inference-perf exited {done.returncode}: {(done.stderr or done.stdout)[-800:]}")
            s = summary(out)
            results.append({"router": name, "wall_s": round(time.monotonic() - t, 1), "summary": s})
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            results.append({"router": name, "not_run": f"{type(e).__name__}: {e}"[:1200]})
        finally:
            if router is not None:
                router.stop()
            pool.stop()
        print(json.dumps(results[-1])[:4000], flush=True)
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results: {workdir / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
