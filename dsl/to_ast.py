"""Lark parse callbacks → `ast` nodes, with spans. Used only by `parser.py`.

The transformer runs inside the LALR parser (lark's `transformer=` option), so no
intermediate parse tree is built: each rule's callback receives its children — with every
token kept, punctuation included — and a node's span is the cover of its first and last
token. That makes the front end about twice as fast as building a tree with positions and
walking it afterwards, which matters when thousands of contracts compile together.
Tokens come from lark-cython's lexer (`lark_cython.Token`: not a `str`, so values are read
from `.value`).
"""

from __future__ import annotations

import json

from lark import Transformer
from lark_cython import Token

from . import ast
from .diagnostics import Diagnostic, error
from .source import Span

_PUNCT = {"LBRACE", "RBRACE", "LSQB", "RSQB", "LPAR", "RPAR", "COLON", "COMMA", "DOT", "OR", "AND", "NOT", "IN", "OF"}


def _is_punct(x) -> bool:
    return type(x) is Token and (x.type in _PUNCT or x.type.startswith("__ANON"))


class ToAst(Transformer):
    class Problem(Exception):
        def __init__(self, diagnostic: Diagnostic) -> None:
            super().__init__(diagnostic.message)
            self.diagnostic = diagnostic

    def __init__(self, file: str) -> None:
        super().__init__()
        self.file = file

    # ------------------------------------------------------------------ spans
    def _tok_span(self, tok: Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column)

    def _cover(self, children) -> Span:
        """From the first child's start to the last child's end (tokens or nodes)."""
        first, last = children[0], children[-1]
        if type(first) is Token:
            l1, c1 = first.line, first.column
        else:
            l1, c1 = first.span.line, first.span.col
        if type(last) is Token:
            return Span(self.file, l1, c1, last.end_line, last.end_column)
        return Span(self.file, l1, c1, last.span.end_line, last.span.end_col)

    @staticmethod
    def _values(children) -> list:
        return [c for c in children if not _is_punct(c)]

    # ------------------------------------------------------------------ leaves
    def _string(self, tok: Token) -> ast.String:
        try:
            json.loads(tok.value)
        except ValueError:
            raise ToAst.Problem(error("E104", f"invalid escape in string {tok}", self._tok_span(tok),
                                      help='strings use JSON escapes: \\" \\\\ \\n \\t \\uXXXX')) from None
        return ast.String(tok.value, self._tok_span(tok))

    def _label(self, x: Token) -> ast.Label:
        if x.type == "STRING":
            return ast.Label(self._string(x).value, True, self._tok_span(x))
        return ast.Label(x.value, False, self._tok_span(x))

    # ------------------------------------------------------------------ rules
    def start(self, items):
        return items

    def block(self, children):
        kind, rest = children[0], children[1:]
        brace = next(i for i, c in enumerate(rest) if isinstance(c, Token) and c.type == "LBRACE")
        labels = [self._label(c) for c in rest[:brace]]
        items = [c for c in rest[brace + 1:] if not isinstance(c, Token)]
        return ast.Block(kind.value, tuple(labels), tuple(items), self._cover(children), self._tok_span(kind))

    def field(self, children):
        key, values = children[0], [c for c in children[2:] if not _is_punct(c)]
        quoted = key.type == "STRING"
        text = self._string(key).value if quoted else key.value
        return ast.Field(text, quoted, tuple(values), self._cover(children), self._tok_span(key))

    def or_(self, children):
        return ast.Or(tuple(self._values(children)), self._cover(children))

    def and_(self, children):
        return ast.And(tuple(self._values(children)), self._cover(children))

    def not_(self, children):
        return ast.Not(children[-1], self._cover(children))

    def compare(self, children):
        left, op, right = children
        return ast.Compare(left, op.value, right, self._cover(children))

    def in_(self, children):
        return ast.Compare(children[0], "in", children[-1], self._cover(children))

    def not_in(self, children):
        return ast.Compare(children[0], "not_in", children[-1], self._cover(children))

    def bound(self, children):
        return ast.Bound(children[0].value, children[1], self._cover(children))

    def range(self, children):
        return ast.Range(children[0], children[-1], self._cover(children))

    def list(self, children):
        return ast.ListValue(tuple(self._values(children)), self._cover(children))

    def string(self, children):
        return self._string(children[0])

    def call(self, children):
        return ast.Call(children[0].value, tuple(self._values(children[1:])), self._cover(children))

    def operand(self, children):  # "(" value ")": parentheses only group
        return children[1]

    def quantity(self, children):
        number = children[0]
        unit = next((c.value for c in children[1:] if isinstance(c, Token) and c.type == "UNIT"), None)
        of = next((c for c in children[1:] if isinstance(c, ast.Name)), None)
        return ast.Quantity(number.value, unit, of, self._cover(children))

    def dotted(self, children):
        return ast.Name(tuple(c.value for c in children if c.type == "NAME"), self._cover(children))
