"""The value types of request variables and headers: one table every layer reads (the
closed vocabulary of what a header or attribute holds, declared once, as Cedar declares
its lints).

Each row is a type's word (`meaning.ValueKind`: the bundle's `ValueType`), its kind (a quantity with a unit, a
name, free text, or a flag), whether a request header may be declared of that type, and
how it is described in messages. The compiler lowers and checks header mappings from it
(`requests.py`, `check_values.py`), the matcher parses header values by its kinds
(`matcher/parse.py`), and `tests/compiler/test_vocabularies.py` holds the bundle's schema
and every layer to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from .meaning import ValueKind


class Kind(str, Enum):
    QUANTITY = "quantity"  # a number with a unit, normalised to SI (`units.py`); takes a `range`
    NAME = "name"  # an identifier; may be limited to `values`
    TEXT = "text"  # any text
    FLAG = "flag"  # yes or no


@dataclass(frozen=True, slots=True)
class ValueSpec:
    word: str  # the type as written in the DSL and the bundle
    kind: Kind
    header: bool  # a request header may be declared of this type
    described: str  # what a value of it is, in messages ("a time (ns, us, ms, s, min)")


V = ValueKind  # the words (`meaning.ValueKind`, the bundle's `ValueType`)
TABLE: tuple[ValueSpec, ...] = (
    ValueSpec(V.TIME, Kind.QUANTITY, True, "a time (ns, us, ms, s, min)"),
    ValueSpec(V.BANDWIDTH, Kind.QUANTITY, True, "a bandwidth (MB/s, GB/s, Gbit/s, …)"),
    ValueSpec(V.FLOPS, Kind.QUANTITY, True, "a FLOP count (1.2e12, 1.2 TFLOP)"),
    ValueSpec(V.RATIO, Kind.QUANTITY, True, "a percentage (40 %)"),
    ValueSpec(V.COUNT, Kind.QUANTITY, True, "a plain number"),
    ValueSpec(V.SIZE, Kind.QUANTITY, False, "a size (MB, GB, GiB, …)"),
    ValueSpec(V.NAME, Kind.NAME, True, "a name"),
    ValueSpec(V.STRING, Kind.TEXT, True, "a string"),
    ValueSpec(V.BOOL, Kind.FLAG, True, "yes or no"),
)

BY_WORD: dict[str, ValueSpec] = {str(v.word): v for v in TABLE}
WORDS: tuple[str, ...] = tuple(BY_WORD)
HEADER_TYPES: tuple[str, ...] = tuple(str(v.word) for v in TABLE if v.header)
QUANTITIES: frozenset[str] = frozenset(str(v.word) for v in TABLE if v.kind is Kind.QUANTITY)


def kind_of(word: str) -> Kind | None:
    spec = BY_WORD.get(word)
    return None if spec is None else spec.kind


def takes_range(word: str) -> bool:
    """A header of this type may declare a `range` (quantities)."""
    return kind_of(word) is Kind.QUANTITY


def takes_values(word: str) -> bool:
    """A header of this type may list its allowed `values` (names)."""
    return kind_of(word) is Kind.NAME


def fits(value: object, word: str) -> bool:
    """Whether `value` is a scalar of type `word` (a bundle's default, say)."""
    kind = kind_of(word)
    if kind is Kind.FLAG:
        return isinstance(value, bool)
    if kind in (Kind.NAME, Kind.TEXT):
        return isinstance(value, str)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["BY_WORD", "HEADER_TYPES", "QUANTITIES", "TABLE", "WORDS", "Kind", "ValueSpec", "fits", "kind_of", "takes_range",
           "takes_values"]
