"""Reading a block's fields against its schema, with diagnostics.

`BlockReader` is how every lowering pass looks at the generic syntax tree: it knows the
fields and sub-blocks a block kind allows, reports unknown ones (with a suggestion),
duplicates and missing required ones, and converts values to typed, SI-normalised Python
values — or reports why it cannot. Each problem is reported once, at the narrowest span.
"""

from __future__ import annotations

from typing import Iterable

from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, did_you_mean, error
from policyc.dsl.source import Span

from . import units
from .bundle import Interval, SourceRef

BOOL_WORDS = {"yes": True, "true": True, "no": False, "false": False}


ref = SourceRef.of  # the bundle keeps the whole span


def shape(v: ast.Value) -> str:
    return {
        ast.Quantity: "a number", ast.Range: "a range", ast.Bound: "a bound", ast.ListValue: "a list",
        ast.Name: "a name", ast.String: "a string", ast.Call: "a call", ast.Compare: "a comparison",
        ast.And: "an expression", ast.Or: "an expression", ast.Not: "an expression",
    }[type(v)]


class BlockReader:
    def __init__(self, block: ast.Block, where: str, diags: list[Diagnostic],
                 fields: Iterable[str], blocks: Iterable[str] = ()) -> None:
        self.block = block
        self.where = where
        self.diags = diags
        self.fields: dict[str, ast.Field] = {}
        self.blocks: dict[str, list[ast.Block]] = {}
        allowed_fields, allowed_blocks = set(fields), set(blocks)
        for item in block.items:
            if isinstance(item, ast.Field):
                if item.key not in allowed_fields:
                    hint = did_you_mean(item.key, allowed_fields)
                    if item.key in allowed_blocks:
                        hint = f"`{item.key}` is a block: write `{item.key} {{ … }}`"
                    self.err("E201", f"unknown field `{item.key}` in {where}", item.key_span, hint)
                elif item.key in self.fields:
                    self.err("E202", f"duplicate field `{item.key}` in {where}", item.key_span,
                             f"first given at line {self.fields[item.key].span.line}")
                else:
                    self.fields[item.key] = item
            else:
                if item.kind not in allowed_blocks:
                    hint = did_you_mean(item.kind, allowed_blocks)
                    if item.kind in allowed_fields:
                        hint = f"`{item.kind}` is a field: write `{item.kind}: …`"
                    self.err("E203", f"unknown block `{item.kind}` in {where}", item.kind_span, hint)
                else:
                    self.blocks.setdefault(item.kind, []).append(item)

    # ------------------------------------------------------------------ reporting
    def err(self, code: str, message: str, span: Span | None, help: str | None = None) -> None:
        self.diags.append(error(code, message, span, help))

    def missing(self, name: str, what: str = "field") -> None:
        self.err("E204", f"{self.where} is missing required {what} `{name}`", self.block.kind_span,
                 f"add `{name}: …`" if what == "field" else f"add a `{name} {{ … }}` block")

    # ------------------------------------------------------------------ access
    def field(self, key: str, required: bool = False) -> ast.Field | None:
        f = self.fields.get(key)
        if f is None and required:
            self.missing(key)
        return f

    def block_one(self, kind: str, required: bool = False) -> ast.Block | None:
        """The one `kind { … }` section of this block. A section takes no label: `memory
        extra { … }` is refused rather than read as `memory`, the label silently lost."""
        found = self.blocks.get(kind, [])
        if not found:
            if required:
                self.missing(kind, "section")
            return None
        for extra in found[1:]:
            self.err("E205", f"duplicate `{kind}` block in {self.where}", extra.kind_span,
                     f"first given at line {found[0].span.line}")
        if found[0].labels:
            self.err("E215", f"the `{kind}` section of {self.where} takes no label, found `{found[0].labels[0].text[:64]}`",
                     found[0].labels[0].span, f"write `{kind} {{ … }}`")
            return None
        return found[0]

    def single(self, key: str, required: bool = False) -> ast.Value | None:
        f = self.field(key, required)
        if f is None:
            return None
        if len(f.values) != 1:
            self.err("E206", f"`{key}` takes one value, got {len(f.values)}", f.values[1].span)
            return None
        return f.values[0]

    # ------------------------------------------------------------------ typed values
    def quantity_value(self, v: ast.Value, key: str, kind: str) -> float | None:
        if not isinstance(v, ast.Quantity):
            self.err("E301", f"`{key}` expects {units.describe(kind)}, found {shape(v)}", v.span)
            return None
        if v.of is not None:
            self.err("E302", f"`of {v.of.dotted}` is only allowed in circuit-break conditions", v.of.span)
            return None
        si = units.to_si(v.number, v.unit, kind)
        if si is None:
            got = units.quantity_type(v.unit)
            self.err("E303", f"`{key}` expects {units.describe(kind)}, found {units.describe(got)} `{v.text}{' ' + v.unit if v.unit else ''}`", v.span)
            return None
        if si != si or si in (float("inf"), float("-inf")):
            self.err("E304", f"`{key}` is not a finite number", v.span)
            return None
        return si

    def quantity(self, key: str, kind: str, required: bool = False, positive: bool = True) -> float | None:
        v = self.single(key, required)
        if v is None:
            return None
        si = self.quantity_value(v, key, kind)
        if si is not None and positive and si <= 0:
            self.err("E305", f"`{key}` must be greater than zero", v.span)
            return None
        return si

    def bound(self, key: str, kind: str, direction: str, required: bool = False) -> float | None:
        """A one-sided bound whose direction is fixed by meaning: `>=` for minimums, `<=` for maximums."""
        v = self.single(key, required)
        if v is None:
            return None
        if not isinstance(v, ast.Bound):
            want = ">=" if direction == "min" else "<="
            self.err("E306", f"`{key}` is a {'minimum' if direction == 'min' else 'maximum'}: write it as a bound", v.span,
                     f"write `{key}: {want} {_text(v)}`")
            return None
        ok_ops = (">=", ">") if direction == "min" else ("<=", "<")
        if v.op not in ok_ops:
            self.err("E307", f"`{key}` is a {'minimum' if direction == 'min' else 'maximum'}, so it takes `{ok_ops[0]}`, not `{v.op}`", v.span)
            return None
        si = self.quantity_value(v.operand, key, kind)
        if si is not None and si <= 0:
            self.err("E305", f"`{key}` must be greater than zero", v.operand.span)
            return None
        return si

    def interval(self, key: str, kind: str, required: bool = False) -> Interval | None:
        v = self.single(key, required)
        if v is None:
            return None
        if not isinstance(v, ast.Range):
            self.err("E308", f"`{key}` expects a range `low .. high`, found {shape(v)}", v.span)
            return None
        lo, hi = self.quantity_value(v.lo, key, kind), self.quantity_value(v.hi, key, kind)
        if lo is None or hi is None:
            return None
        if lo < 0:
            self.err("E305", f"`{key}` must not be negative", v.lo.span)
            return None
        if lo > hi:
            self.err("E325", f"`{key}` is upside down: the low end is above the high end", v.span,
                     f"write `{_text(v.hi)} .. {_text(v.lo)}`")
            return None
        return Interval(lo=lo, hi=hi)

    def name(self, key: str, choices: Iterable[str] | None = None, required: bool = False) -> str | None:
        v = self.single(key, required)
        return None if v is None else self.name_value(v, key, choices)

    def name_value(self, v: ast.Value, key: str, choices: Iterable[str] | None = None) -> str | None:
        if not isinstance(v, ast.Name) or len(v.parts) != 1:
            self.err("E309", f"`{key}` expects a name, found {shape(v)}", v.span)
            return None
        word = v.parts[0]
        if choices is not None and word not in set(choices):
            opts = sorted(choices)
            self.err("E310", f"`{word}` is not a valid `{key}`", v.span,
                     did_you_mean(word, opts) or f"one of: {', '.join(opts)}")
            return None
        return word

    def names(self, key: str, choices: Iterable[str] | None = None, required: bool = False) -> tuple[str, ...] | None:
        f = self.field(key, required)
        if f is None:
            return None
        items: list[ast.Value] = []
        for v in f.values:
            items.extend(v.items if isinstance(v, ast.ListValue) else [v])
        out = [self.name_value(v, key, choices) for v in items]
        if any(o is None for o in out):
            return None
        seen: set[str] = set()
        for v, o in zip(items, out):
            if o in seen:
                self.err("E311", f"`{o}` is listed twice in `{key}`", v.span)
            seen.add(o)  # type: ignore[arg-type]
        return tuple(o for o in out if o is not None)

    def string_value(self, v: ast.Value, key: str) -> str | None:
        if not isinstance(v, ast.String):
            self.err("E312", f"`{key}` expects a string, found {shape(v)}", v.span, "write it in double quotes")
            return None
        return v.value

    def string(self, key: str, required: bool = False) -> str | None:
        v = self.single(key, required)
        return None if v is None else self.string_value(v, key)

    def strings(self, key: str) -> tuple[str, ...] | None:
        f = self.field(key)
        if f is None:
            return None
        items: list[ast.Value] = []
        for v in f.values:
            items.extend(v.items if isinstance(v, ast.ListValue) else [v])
        out = [self.string_value(v, key) for v in items]
        return None if any(o is None for o in out) else tuple(o for o in out if o is not None)

    def boolean(self, key: str, required: bool = False) -> bool | None:
        v = self.single(key, required)
        if v is None:
            return None
        if isinstance(v, ast.Name) and v.dotted in BOOL_WORDS:
            return BOOL_WORDS[v.dotted]
        self.err("E313", f"`{key}` expects yes or no, found {shape(v)} `{_text(v)}`", v.span)
        return None

    def integer(self, key: str, required: bool = False, minimum: int = 1, maximum: int = 1_000_000_000) -> int | None:
        v = self.single(key, required)
        if v is None:
            return None
        if not isinstance(v, ast.Quantity) or v.unit is not None or v.of is not None or not v.text.isdigit():
            self.err("E314", f"`{key}` expects a whole number, found `{_text(v)}`", v.span)
            return None
        n = int(v.text)
        if n < minimum:
            self.err("E305", f"`{key}` must be at least {minimum}", v.span)
            return None
        if n > maximum:
            self.err("E327", f"`{key}` must be at most {maximum:,}", v.span)
            return None
        return n


def _text(v: ast.Value) -> str:
    from policyc.dsl.printer import format_value

    return format_value(v)
