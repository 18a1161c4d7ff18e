"""Time `policyc validate` on reference transformers of ~10 M and ~100 M parameters.

For each model: validation (read graph + contract, pin shapes, count FLOPs) with the weights
stored inside the .onnx and with the weights in an external data file (which validation
never opens), `--run` for the small model, and as the baseline measured in the same run,
onnx-tool's profiler (a peer that also counts from the graph) on the same file.

    .venv/bin/python benchmarks/onnx_validate.py [--quick]     # --quick: the 10 M model only
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx

from policyc.compiler.bundle import Compute, Contract, Dependencies, Interval, Memory, SourceRef
from policyc.onnxgate import count_flops, embed_contract
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer
from policyc.onnxgate.validate import validate_model

SPECS = {
    "10M": TransformerSpec(vocab=12000, d_model=256, heads=4, layers=4, d_ff=1024, max_len=512),
    "100M": TransformerSpec(vocab=8000, d_model=768, heads=12, layers=12, d_ff=3072, max_len=512),
}
TOKENS = 128


def _contract(flops: int) -> Contract:
    ref = SourceRef(file="bench.contract", line=1, col=1)
    return Contract(
        name="bench", version="1", compute=Compute(flops=Interval(lo=flops, hi=flops), per="request", tokens=TOKENS),
        memory=Memory(bandwidth_min=80e9, burst_max=0.2), dependencies=Dependencies(), origin=ref,
    )


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _onnx_tool(path: Path) -> None:
    import onnx_tool

    m = onnx_tool.Model(str(path))
    m.graph.shape_infer({"input_ids": __import__("numpy").zeros((1, TOKENS), "int64")})
    m.graph.profile()


def bench(label: str, spec: TransformerSpec, tmp: Path, repeat: int, with_run: bool) -> None:
    model = build_transformer(spec)
    flops = count_flops(model, TOKENS).total()
    model = embed_contract(model, _contract(flops))
    inline = tmp / f"{label}.onnx"
    onnx.save(model, str(inline))
    external = tmp / f"{label}_ext.onnx"
    onnx.save(model, str(external), save_as_external_data=True, location=f"{label}_ext.bin", size_threshold=1024)
    assert validate_model(inline).ok and validate_model(external).ok
    t_inline = _median(lambda: validate_model(inline), repeat)
    t_external = _median(lambda: validate_model(external), repeat)
    t_tool = _median(lambda: _onnx_tool(inline), max(1, repeat // 2))
    mb = inline.stat().st_size / 1e6
    print(f"{label}: {spec.parameters() / 1e6:.1f} M parameters, {mb:.0f} MB file, {flops:.3e} FLOPs at {TOKENS} tokens")
    print(f"  validate, weights inline    {t_inline * 1e3:8.1f} ms   ({t_tool / t_inline:5.2f}x faster than onnx-tool)")
    print(f"  validate, weights external  {t_external * 1e3:8.1f} ms   ({t_tool / t_external:5.2f}x faster than onnx-tool)")
    print(f"  baseline: onnx-tool profile {t_tool * 1e3:8.1f} ms")
    if with_run:
        t_run = _median(lambda: validate_model(inline, run=True), max(1, repeat // 2))
        print(f"  validate --run (100 tokens) {t_run * 1e3:8.1f} ms   ({t_run / t_inline:5.2f}x the static gate)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the 10 M model only, fewer repeats")
    args = ap.parse_args()
    repeat = 3 if args.quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        for label, spec in SPECS.items():
            if args.quick and label != "10M":
                continue
            bench(label, spec, Path(tmp), repeat, with_run=label == "10M")


if __name__ == "__main__":
    main()
