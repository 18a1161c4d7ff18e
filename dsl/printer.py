"""Canonical layout for `policyc fmt`.

One item per line, two-space indentation, at most one blank line kept where the author
put blank lines, one space around binary operators, blocks always
open on their header line. Comments are kept: a comment on the line where a field starts
stays at the end of that field's line; any other comment is printed on its own line before
the next item that followed it in the source. Idempotent: fmt(fmt(x)) == fmt(x).
"""

from __future__ import annotations

from . import ast

_PRECEDENCE = {ast.Or: 1, ast.And: 2, ast.Not: 3}


def format_value(v: ast.Value, parent: int = 0) -> str:
    if isinstance(v, ast.Quantity):
        text = v.text + (f" {v.unit}" if v.unit else "")
        return text + (f" of {v.of.dotted}" if v.of else "")
    if isinstance(v, ast.Range):
        return f"{format_value(v.lo)} .. {format_value(v.hi)}"
    if isinstance(v, ast.Bound):
        return f"{v.op} {_operand(v.operand)}"
    if isinstance(v, ast.ListValue):
        return "[" + ", ".join(format_value(i) for i in v.items) + "]"
    if isinstance(v, ast.Name):
        return v.dotted
    if isinstance(v, ast.String):
        return v.raw
    if isinstance(v, ast.Call):
        return f"{v.func}(" + ", ".join(format_value(a) for a in v.args) + ")"
    if isinstance(v, ast.Compare):
        op = "not in" if v.op == "not_in" else v.op
        return f"{_operand(v.left)} {op} {_operand(v.right)}"
    prec = _PRECEDENCE[type(v)]
    if isinstance(v, ast.Not):
        text = "not " + format_value(v.arg, prec)
    else:
        word = " or " if isinstance(v, ast.Or) else " and "
        # a nested node of the same kind needs parentheses to keep its own grouping
        text = word.join(format_value(a, prec + (type(a) is type(v))) for a in v.args)
    return f"({text})" if prec <= parent else text


def _operand(v: ast.Value) -> str:
    """Operands of comparisons and bounds: boolean sub-expressions need parentheses."""
    text = format_value(v)
    return f"({text})" if isinstance(v, (ast.And, ast.Or, ast.Not, ast.Compare, ast.Bound)) else text


def _label(label: ast.Label) -> str:
    if label.quoted:
        import json

        return json.dumps(label.text, ensure_ascii=False)
    return label.text


class _Printer:
    """Emits lines; keeps one blank line wherever the source had one or more between two
    elements (items or comments), never directly after `{` or before `}`."""

    def __init__(self, comments: tuple[ast.Comment, ...]) -> None:
        self.pending = sorted(comments, key=lambda c: c.line)
        self.lines: list[str] = []
        self.last_line = 0  # source line of the last element emitted
        self.opened = True  # at the start of the file or just after a `{`

    def _emit(self, src_line: int, text: str) -> None:
        if not self.opened and src_line > self.last_line + 1:
            self.lines.append("")
        self.lines.append(text)
        self.opened = False

    def _leading(self, before_line: int, indent: str) -> None:
        while self.pending and self.pending[0].line < before_line:
            c = self.pending.pop(0)
            self._emit(c.line, indent + c.text)
            self.last_line = c.line

    def _trailing(self, line: int) -> str:
        if self.pending and self.pending[0].line == line:
            return "  " + self.pending.pop(0).text
        return ""

    def items(self, items: tuple[ast.Item, ...], depth: int) -> None:
        indent = "  " * depth
        for item in items:
            self._leading(item.span.line, indent)
            if isinstance(item, ast.Block):
                head = " ".join([item.kind, *(_label(lab) for lab in item.labels)])
                self._emit(item.span.line, f"{indent}{head} {{" + self._trailing(item.span.line))
                self.last_line, self.opened = item.span.line, True
                self.items(item.items, depth + 1)
                self._leading(item.span.end_line, indent + "  ")
                self.lines.append(f"{indent}}}" + self._trailing(item.span.end_line))
                self.opened = False
            else:
                import json

                key = json.dumps(item.key, ensure_ascii=False) if item.quoted else item.key
                values = ", ".join(format_value(v) for v in item.values)
                self._emit(item.span.line, f"{indent}{key}: {values}" + self._trailing(item.span.line))
            self.last_line = item.span.end_line


def format_file(f: ast.File) -> str:
    p = _Printer(f.comments)
    p.items(f.items, 0)
    p._leading(10**9, "")
    return "\n".join(p.lines) + "\n" if p.lines else ""
