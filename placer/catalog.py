"""The GPU classes the simulator deploys, with their published datasheet figures.

The bundle's GPU catalog is authoritative at run time; this one exists so that the
simulator, the tests and the benchmark can compute shares without a compiled bundle.
Names and architectures match the project's catalog (A100-40G, A100-80G, H100, H200, L4,
L40S). Figures are dense (no sparsity) FLOP/s, HBM bytes/s and memory bytes.
"""

from __future__ import annotations

from policyc.compiler.bundle import GpuClass, SourceRef

_ORIGIN = SourceRef(file="<placer builtin catalog>", line=1, col=1)

_AMPERE = (("fp16", 312e12), ("bf16", 312e12), ("tf32", 156e12), ("fp32", 19.5e12), ("int8", 624e12))
_HOPPER = (("fp8", 1979e12), ("fp16", 989e12), ("bf16", 989e12), ("tf32", 494e12), ("fp32", 67e12), ("int8", 1979e12))

DEFAULT_CATALOG: tuple[GpuClass, ...] = (
    GpuClass(name="A100-40G", arch="ampere", peak_flops=_AMPERE, hbm_bandwidth=1.555e12, memory=40e9, origin=_ORIGIN),
    GpuClass(name="A100-80G", arch="ampere", peak_flops=_AMPERE, hbm_bandwidth=2.039e12, memory=80e9, origin=_ORIGIN),
    GpuClass(name="H100", arch="hopper", peak_flops=_HOPPER, hbm_bandwidth=3.35e12, memory=80e9, origin=_ORIGIN),
    GpuClass(name="H200", arch="hopper", peak_flops=_HOPPER, hbm_bandwidth=4.8e12, memory=141e9, origin=_ORIGIN),
    GpuClass(
        name="L4", arch="ada", hbm_bandwidth=300e9, memory=24e9, origin=_ORIGIN,
        peak_flops=(("fp8", 242e12), ("fp16", 121e12), ("bf16", 121e12), ("fp32", 30.3e12), ("int8", 242e12)),
    ),
    GpuClass(
        name="L40S", arch="ada", hbm_bandwidth=864e9, memory=48e9, origin=_ORIGIN,
        peak_flops=(("fp8", 733e12), ("fp16", 362e12), ("bf16", 362e12), ("fp32", 91.6e12), ("int8", 733e12)),
    ),
)

GPU_CLASS_NAMES: tuple[str, ...] = tuple(g.name for g in DEFAULT_CATALOG)


def catalog_by_name(catalog: tuple[GpuClass, ...] = DEFAULT_CATALOG) -> dict[str, GpuClass]:
    """Index a catalog by class name (the placer looks classes up per candidate)."""
    return {g.name: g for g in catalog}


def catalog_for(bundle_catalog: tuple[GpuClass, ...]) -> tuple[GpuClass, ...]:
    """The placer's catalog for a bundle: the bundle's GPU classes, which win, then this
    module's for classes the bundle lacks (a simulated fleet may deploy them). Built at
    start and again on every reload (`Placer.load_catalog`)."""
    names = {g.name for g in bundle_catalog}
    return tuple(bundle_catalog) + tuple(g for g in DEFAULT_CATALOG if g.name not in names)
