"""Units are part of the type. Every quantity is normalised to SI here.

time → seconds; bandwidth → bytes/s (decimal prefixes; `bit/s` divides by 8, binary
`KiB/s`… multiply by 1024ⁿ); size → bytes; flops → FLOPs; flop rate → FLOP/s;
ratio → a fraction (`40 %` → 0.4). A bare number is a `count`, or FLOPs where FLOPs are
expected (FLOPs are conventionally written as plain scientific notation: 1.2e12).
"""

from __future__ import annotations

from .bundle import ValueType
from .value_types import BY_WORD

QuantityType = str  # one of ValueType's quantity kinds, or "flop_rate"

UNITS: dict[str, tuple[QuantityType, float]] = {
    "ns": ("time", 1e-9), "us": ("time", 1e-6), "µs": ("time", 1e-6), "ms": ("time", 1e-3),
    "s": ("time", 1.0), "min": ("time", 60.0), "h": ("time", 3600.0),
    "B/s": ("bandwidth", 1.0), "KB/s": ("bandwidth", 1e3), "MB/s": ("bandwidth", 1e6),
    "GB/s": ("bandwidth", 1e9), "TB/s": ("bandwidth", 1e12),
    "KiB/s": ("bandwidth", 2.0**10), "MiB/s": ("bandwidth", 2.0**20), "GiB/s": ("bandwidth", 2.0**30),
    "bit/s": ("bandwidth", 1 / 8), "Kbit/s": ("bandwidth", 1e3 / 8), "Mbit/s": ("bandwidth", 1e6 / 8),
    "Gbit/s": ("bandwidth", 1e9 / 8), "Tbit/s": ("bandwidth", 1e12 / 8),
    "B": ("size", 1.0), "KB": ("size", 1e3), "MB": ("size", 1e6), "GB": ("size", 1e9), "TB": ("size", 1e12),
    "KiB": ("size", 2.0**10), "MiB": ("size", 2.0**20), "GiB": ("size", 2.0**30), "TiB": ("size", 2.0**40),
    "FLOP": ("flops", 1.0), "KFLOP": ("flops", 1e3), "MFLOP": ("flops", 1e6), "GFLOP": ("flops", 1e9),
    "TFLOP": ("flops", 1e12), "PFLOP": ("flops", 1e15),
    "FLOP/s": ("flop_rate", 1.0), "GFLOP/s": ("flop_rate", 1e9), "TFLOP/s": ("flop_rate", 1e12),
    "PFLOP/s": ("flop_rate", 1e15),
    "%": ("ratio", 0.01),
}

# what a value of each type is, in messages: the value-type table's words, and the FLOP rate
# (a quantity of the catalog's peaks, never a header's or an attribute's type)
TYPE_WORDS: dict[str, str] = {**{w: v.described for w, v in BY_WORD.items()}, "flop_rate": "a FLOP rate (TFLOP/s)"}


def quantity_type(unit: str | None) -> QuantityType:
    return "count" if unit is None else UNITS[unit][0]


def to_si(number: float, unit: str | None, expected: QuantityType) -> float | None:
    """The SI value, or None when the unit's type is not the expected one."""
    if unit is None:
        return number if expected in ("count", "flops") else None
    kind, factor = UNITS[unit]
    return number * factor if kind == expected else None


def describe(t: ValueType | QuantityType) -> str:
    return TYPE_WORDS.get(t, t)


def format_si(value: float, kind: str) -> str:
    """An SI value back in the units people write, for messages and reports."""
    import math

    if math.isinf(value):
        return "unbounded"
    if kind == "time":
        return f"{value * 1e3:g} ms" if value < 1 else f"{value:g} s"
    if kind == "bandwidth":
        return f"{value / 1e9:g} GB/s"
    if kind == "flops":
        return f"{value:.3g} FLOP"
    if kind == "flop_rate":
        return f"{value / 1e12:g} TFLOP/s"
    if kind == "ratio":
        return f"{value * 100:g} %"
    if kind == "size":
        return f"{value / 1e9:g} GB"
    return f"{value:g}"
