"""Lark parse tree → `ast` nodes, with spans. Used only by `parser.py`."""

from __future__ import annotations

import json

from lark import Token, Transformer, v_args

from . import ast
from .diagnostics import Diagnostic, error
from .source import Span


class ToAst(Transformer):
    class Problem(Exception):
        def __init__(self, diagnostic: Diagnostic) -> None:
            super().__init__(diagnostic.message)
            self.diagnostic = diagnostic

    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file

    def _span(self, meta) -> Span:
        return Span(self.file, meta.line, meta.column, meta.end_line, meta.end_column)

    def _tok_span(self, tok: Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + len(tok))

    def _string(self, tok: Token) -> ast.String:
        try:
            json.loads(str(tok))
        except ValueError:
            raise ToAst.Problem(error("E104", f"invalid escape in string {tok}", self._tok_span(tok),
                                      help='strings use JSON escapes: \\" \\\\ \\n \\t \\uXXXX')) from None
        return ast.String(str(tok), self._tok_span(tok))

    def _label(self, x) -> ast.Label:
        if isinstance(x, Token) and x.type == "STRING":
            return ast.Label(self._string(x).value, True, self._tok_span(x))
        return ast.Label(str(x), False, self._tok_span(x))

    def start(self, items):
        return items

    @v_args(meta=True)
    def block(self, meta, children):
        kind, rest = children[0], children[1:]
        labels = [self._label(c) for c in rest if isinstance(c, Token)]
        items = [c for c in rest if not isinstance(c, Token)]
        return ast.Block(str(kind), tuple(labels), tuple(items), self._span(meta), self._tok_span(kind))

    @v_args(meta=True)
    def field(self, meta, children):
        key, values = children[0], children[1:]
        quoted = key.type == "STRING"
        text = self._string(key).value if quoted else str(key)
        return ast.Field(text, quoted, tuple(values), self._span(meta), self._tok_span(key))

    @v_args(meta=True)
    def or_(self, meta, children):
        return children[0] if len(children) == 1 else ast.Or(tuple(children), self._span(meta))

    @v_args(meta=True)
    def and_(self, meta, children):
        return children[0] if len(children) == 1 else ast.And(tuple(children), self._span(meta))

    @v_args(meta=True)
    def not_(self, meta, children):
        return ast.Not(children[0], self._span(meta))

    @v_args(meta=True)
    def compare(self, meta, children):
        left, op, right = children
        return ast.Compare(left, str(op), right, self._span(meta))

    @v_args(meta=True)
    def in_(self, meta, children):
        return ast.Compare(children[0], "in", children[1], self._span(meta))

    @v_args(meta=True)
    def not_in(self, meta, children):
        return ast.Compare(children[0], "not_in", children[1], self._span(meta))

    @v_args(meta=True)
    def bound(self, meta, children):
        return ast.Bound(str(children[0]), children[1], self._span(meta))

    @v_args(meta=True)
    def range(self, meta, children):
        return ast.Range(children[0], children[1], self._span(meta))

    @v_args(meta=True)
    def list(self, meta, children):
        return ast.ListValue(tuple(c for c in children if c is not None), self._span(meta))

    def string(self, children):
        return self._string(children[0])

    @v_args(meta=True)
    def call(self, meta, children):
        return ast.Call(str(children[0]), tuple(c for c in children[1:] if c is not None), self._span(meta))

    @v_args(meta=True)
    def quantity(self, meta, children):
        number = children[0]
        unit = next((str(c) for c in children[1:] if isinstance(c, Token) and c.type == "UNIT"), None)
        of = next((c for c in children[1:] if isinstance(c, ast.Name)), None)
        return ast.Quantity(str(number), unit, of, self._span(meta))

    @v_args(meta=True)
    def dotted(self, meta, children):
        return ast.Name(tuple(str(c) for c in children), self._span(meta))
