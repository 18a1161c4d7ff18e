"""Lower `gpu` blocks to the GPU catalog (`bundle.GpuClass`).

The catalog is data, not code: the solver derives GPU-share bounds from it and the
matcher refuses instances on GPUs that cannot meet a contract's bandwidth. policyc ships
one in `policies/gpu-catalog.contract`; a site overrides it with its own file.
"""

from __future__ import annotations

from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, error

from .bundle import GpuClass
from .contracts import ARCHS, PRECISIONS
from .fields import BlockReader, ref


def lower_gpu(block: ast.Block, diags: list[Diagnostic]) -> GpuClass | None:
    if len(block.labels) != 1:
        diags.append(error("E207", "a GPU class is written `gpu NAME { … }`", block.kind_span))
        return None
    name = block.labels[0].text
    n_before = len(diags)
    r = BlockReader(block, f"gpu `{name}`", diags, fields=("arch", "hbm_bandwidth", "memory"), blocks=("peak",))
    arch = r.name("arch", ARCHS, required=True)
    bw = r.quantity("hbm_bandwidth", "bandwidth", required=True)
    mem = r.quantity("memory", "size", required=True)
    peaks: list[tuple[str, float]] = []
    if (p := r.block_one("peak", required=True)) is not None:
        pr = BlockReader(p, f"`peak` of gpu `{name}`", diags, fields=PRECISIONS)
        for key in pr.fields:
            v = pr.quantity(key, "flop_rate")
            if v is not None:
                peaks.append((key, v))
        if not pr.fields:
            pr.err("E204", f"`peak` of gpu `{name}` lists no precision", p.kind_span, "add e.g. `fp16: 312 TFLOP/s`")
    if len(diags) > n_before or arch is None or bw is None or mem is None:
        return None
    return GpuClass(name=name, arch=arch, peak_flops=tuple(sorted(peaks)), hbm_bandwidth=bw, memory=mem, origin=ref(block.span))
