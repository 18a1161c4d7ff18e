"""SI quantities back into the units people write, for messages and diff output."""

from __future__ import annotations

import math


def format_quantity(v: float, vtype: str) -> str:
    if math.isinf(v):
        return "unbounded"
    if vtype == "time":
        return f"{v * 1e3:g} ms" if v < 1 else f"{v:g} s"
    if vtype == "bandwidth":
        return f"{v / 1e9:g} GB/s"
    if vtype == "flops":
        return f"{v:.3g} FLOP"
    if vtype == "ratio":
        return f"{v * 100:g} %"
    if vtype == "size":
        return f"{v / 1e9:g} GB"
    return f"{v:g}"
