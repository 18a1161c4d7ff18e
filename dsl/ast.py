"""The syntax tree of a `.contract` file.

Frozen dataclasses; every node has a `span`, excluded from equality and hashing so that
layout does not change meaning (parse(fmt(x)) == parse(x)). The tree is deliberately
generic — blocks, fields and value expressions — and the compiler gives blocks their
meaning against a schema; see `compiler/schema.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from .source import Span


NO_SPAN = Span("<generated>", 0, 0, 0, 0)


def _span() -> Span:
    """Spans never take part in equality; nodes built by code (not parsed) get NO_SPAN."""
    return field(default=NO_SPAN, compare=False, hash=False, repr=False)  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number with an optional unit; `of` scales it by a named quantity (92.5 % of slo)."""

    text: str
    unit: str | None
    of: "Name | None"
    span: Span = _span()

    @property
    def number(self) -> float:
        return float(self.text)


@dataclass(frozen=True, slots=True)
class Range:
    lo: Quantity
    hi: Quantity
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Bound:
    """A one-sided bound written as a value: `>= 80 GB/s`."""

    op: str
    operand: "Value"
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class ListValue:
    items: tuple["Value", ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Name:
    """A bare or dotted name: `us-west`, `request.slo`, `labels.team`."""

    parts: tuple[str, ...]
    span: Span = _span()

    @property
    def dotted(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True, slots=True)
class String:
    raw: str  # as written, with quotes and escapes
    span: Span = _span()

    @property
    def value(self) -> str:
        import json

        return json.loads(self.raw)


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple["Value", ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Compare:
    left: "Value"
    op: str  # == != < <= > >= in not_in
    right: "Value"
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class And:
    args: tuple["Value", ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Or:
    args: tuple["Value", ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Not:
    arg: "Value"
    span: Span = _span()


Value = Union[Quantity, Range, Bound, ListValue, Name, String, Call, Compare, And, Or, Not]


@dataclass(frozen=True, slots=True)
class Label:
    text: str  # unquoted content
    quoted: bool
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Field:
    key: str
    quoted: bool
    values: tuple[Value, ...]
    span: Span = _span()
    key_span: Span = _span()


@dataclass(frozen=True, slots=True)
class Block:
    kind: str
    labels: tuple[Label, ...]
    items: tuple["Item", ...]
    span: Span = _span()
    kind_span: Span = _span()

    def fields(self) -> list[Field]:
        return [i for i in self.items if isinstance(i, Field)]

    def blocks(self) -> list["Block"]:
        return [i for i in self.items if isinstance(i, Block)]


Item = Union[Block, Field]


@dataclass(frozen=True, slots=True)
class Comment:
    line: int
    text: str


@dataclass(frozen=True, slots=True)
class File:
    name: str
    items: tuple[Item, ...]
    comments: tuple[Comment, ...] = field(default=(), compare=False, hash=False, repr=False)
