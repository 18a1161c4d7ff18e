"""Compile N generated contracts (default 10,000) and report time and peak memory.

Figures: wall time of the whole compile (parse → lower → resolve → plan → emit, Z3 analyses
excluded, as the issue's floor says), per-stage split, peak RSS growth, and the ratio to a
baseline measured in the same run: parsing alone (lark, the floor any front end pays).

    .venv/bin/python benchmarks/compile.py [--contracts 10000] [--with-solver]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import sys
import time

from policyc.compiler import bundle_io
from policyc.compiler.pipeline import compile_sources
from policyc.dsl.parser import parse
from policyc.dsl.source import Source

REGIONS = ["us-west", "us-east", "eu-west", "eu-central"]
ARCHS = ["ampere", "hopper", "ada"]
SEC = ["tpm", "memory_encryption", "hardware_firewall", "tee"]


def contract(i: int, rng: random.Random) -> str:
    lo = rng.uniform(1e10, 1e12)
    regions = ", ".join(rng.sample(REGIONS, rng.randint(1, 3)))
    archs = ", ".join(rng.sample(ARCHS, rng.randint(1, 2)))
    sec = ", ".join(rng.sample(SEC, rng.randint(0, 3)))
    svc = f"""
    service cache-{i} {{
      kind: redis
      p99: <= {rng.randint(1, 20)} ms
    }}""" if rng.random() < 0.5 else ""
    return f"""contract model-{i} version "1.{i % 7}.0" {{
  compute {{
    flops_per_request: {lo:.4g} .. {lo * rng.uniform(1.1, 1.6):.4g}
    tokens: {rng.choice([64, 128, 256, 512])}
    precision: {rng.choice(["fp16", "bf16", "int8"])}
    efficiency: {rng.randint(30, 60)} %
  }}
  memory {{
    bandwidth: >= {rng.randint(20, 900)} GB/s
    burst: <= {rng.randint(50, 500)} ms
  }}
  dependencies {{{svc}
    async_callbacks: {rng.choice(["yes", "no"])}
    cuda: >= 12.1, < 13.0
    libraries: ["onnxruntime >= 1.17"]
  }}
  slo {{
    latency: <= {rng.randint(100, 2000)} ms
    allowance: {rng.randint(5, 50)} ms
  }}
  placement {{
    regions: [{regions}]
    gpu_arch: [{archs}]
    security: [{sec}]
  }}
  labels {{
    team: "team-{i % 40}"
  }}
}}
"""


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the compile's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contracts", type=int, default=10_000)
    ap.add_argument("--per-file", type=int, default=100)
    ap.add_argument("--with-solver", action="store_true", help="include the Z3 analyses (not part of the floor)")
    args = ap.parse_args()
    rng = random.Random(7)
    catalog = open("policies/gpu-catalog.contract").read()
    texts = [contract(i, rng) for i in range(args.contracts)]
    files = [Source("gpu-catalog.contract", catalog)] + [
        Source(f"gen-{n:04d}.contract", "\n".join(texts[n: n + args.per_file])) for n in range(0, len(texts), args.per_file)
    ]
    size = sum(len(s.text) for s in files)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    gc.disable()  # the same collector setting the compiler uses, so the baseline is fair
    t0 = time.perf_counter()
    trees = []
    for s in files:
        tree, diags = parse(s)
        assert tree is not None, diags
        trees.append(tree)
    t_parse = time.perf_counter() - t0
    del trees
    gc.enable()

    load0 = os.getloadavg()[0]
    cpu0 = _cpu()
    t0 = time.perf_counter()
    result = compile_sources(files, analyse=args.with_solver)
    t_compile = time.perf_counter() - t0
    cpu_compile = _cpu() - cpu0
    assert result.ok, [d.message for d in result.errors[:5]]
    t0 = time.perf_counter()
    text = bundle_io.dumps(result.bundle)
    t_emit = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    print(f"contracts            {args.contracts} in {len(files)} files, {size / 1e6:.1f} MB of source")
    print(f"baseline parse only  {t_parse:.2f} s")
    print(f"compile{' + solver' if args.with_solver else ' (no Z3)':<13} {t_compile:.2f} s  ({t_compile / args.contracts * 1e6:.0f} us/contract; "
          f"CPU {cpu_compile:.2f} s in this process and its workers)")
    print(f"write bundle         {t_emit:.2f} s  ({len(text) / 1e6:.1f} MB)")
    print(f"total                {t_compile + t_emit:.2f} s  (floor: 10 s)")
    print(f"ratio to parse-only  {(t_compile + t_emit) / t_parse:.2f}x")
    print(f"peak RSS             {rss1 / 1024:.0f} MB (grew {(rss1 - rss0) / 1024:.0f} MB)")
    print(f"load average         {load0:.2f} at the start of the compile, {os.getloadavg()[0]:.2f} at the end "
          f"({os.cpu_count()} CPUs): other work on the machine slows every figure")
    sys.exit(0 if t_compile + t_emit < 10 or args.with_solver else 1)


if __name__ == "__main__":
    main()
