"""Compile N generated contracts (default 10,000) and report time and peak memory.

Figures: wall time of the whole compile (parse → lower → resolve → plan → emit, Z3 analyses
excluded, as the issue's floor says), per-stage split, peak RSS growth, and the ratio to a
baseline measured in the same run: parsing alone (lark, the floor any front end pays).

    .venv/bin/python benchmarks/compile.py [--contracts 10000] [--with-solver]
    .venv/bin/python benchmarks/compile.py --against REV [--contracts 2000] [--rounds 3]

`--against REV` compares CPU seconds of a serial compile plus writing the bundle, today's
tree against the tree at git revision REV, alternating one process per side and round, so
that both sides see the same machine load.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import tempfile
from pathlib import Path
import random
import resource
import sys
import time

# policyc is imported inside the functions: `--against` runs this file with an older tree
# first on the path, which must be in place before the first `import policyc`.

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


def sources(contracts: int, per_file: int = 100) -> list:
    """The GPU catalog and `contracts` generated contracts, `per_file` to a file (seeded)."""
    from policyc.dsl.source import Source

    rng = random.Random(7)
    texts = [contract(i, rng) for i in range(contracts)]
    return [Source("gpu-catalog.contract", Path("policies/gpu-catalog.contract").read_text())] + [
        Source(f"gen-{n:04d}.contract", "\n".join(texts[n: n + per_file])) for n in range(0, contracts, per_file)]


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the compile's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _serial_side(root: str, contracts: int) -> None:
    """One side of `--against`: print the CPU seconds of a serial compile + write."""
    if root != "today":
        sys.path.insert(0, root)
    import policyc.compiler.pipeline as pipeline
    from policyc.compiler import bundle_io as io
    try:
        from policyc.compiler import front_end
        front_end.PARALLEL_MIN_BYTES = 10**12
    except ImportError:  # trees before compiler/front_end.py
        pipeline.PARALLEL_MIN_BYTES = 10**12
    files = sources(contracts)
    t = time.process_time()
    io.dumps(pipeline.compile_sources(files, analyse=False).bundle)
    print(f"{time.process_time() - t:.3f} {Path(pipeline.__file__).parent.parent}")


def _against(rev: str, contracts: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "policyc"
        pkg.mkdir()
        archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive, check=True)
        sides = {"before": tmp, "today": "today"}
        cpu: dict[str, list[float]] = {k: [] for k in sides}

        def side(name: str, n: int) -> str:
            return subprocess.run([sys.executable, __file__, "--serial-side", sides[name], "--contracts", str(n)],
                                  check=True, capture_output=True, text=True).stdout

        for name in sides:  # once, small: byte-compiles the extracted tree, as today's already is
            side(name, 100)
        for r in range(rounds):
            for name in (sides if r % 2 == 0 else reversed(list(sides))):
                out = side(name, contracts)
                seconds, tree = out.split()[-2:]
                assert (tree == tmp + "/policyc") == (name == "before"), f"{name} side ran the tree at {tree}"
                cpu[name].append(float(seconds))
        for name, v in cpu.items():
            print(f"{name:<7} {rev if name == 'before' else 'working tree':<12} CPU s per round: "
                  + ", ".join(f"{x:.2f}" for x in v) + f"  (min {min(v):.2f})")
        print(f"ratio today / before (min of rounds): {min(cpu['today']) / min(cpu['before']):.2f}x; "
              f"{contracts} contracts, serial front end, compile + write, load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contracts", type=int, default=10_000)
    ap.add_argument("--per-file", type=int, default=100)
    ap.add_argument("--with-solver", action="store_true", help="include the Z3 analyses (not part of the floor)")
    ap.add_argument("--against", metavar="REV", help="A/B of the serial compile against the tree at a git revision")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serial-side", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serial_side:
        return _serial_side(args.serial_side, args.contracts)
    if args.against:
        return _against(args.against, args.contracts if args.contracts != 10_000 else 2_000, args.rounds)
    from policyc.compiler import bundle_io
    from policyc.compiler.pipeline import compile_sources
    from policyc.dsl.parser import parse

    files = sources(args.contracts, args.per_file)
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
