"""Lark parse callbacks → `ast` nodes, with spans. Used only by `parser.py`.

The transformer runs inside the LALR parser (lark's `transformer=` option), so no
intermediate parse tree is built: each rule's callback receives its children — with every
token kept, punctuation included — and a node's span is the cover of its first and last
token. That makes the front end about twice as fast as building a tree with positions and
walking it afterwards, which matters when thousands of contracts compile together.
"""

from __future__ import annotations

import json

from lark import Token, Transformer

from . import ast
from .diagnostics import Diagnostic, error
from .source import Span

_PUNCT = {"LBRACE", "RBRACE", "LSQB", "RSQB", "LPAR", "RPAR", "COLON", "COMMA", "DOT", "OR", "AND", "NOT", "IN", "OF"}


def _is_punct(x) -> bool:
    return isinstance(x, Token) and (x.type in _PUNCT or x.type.startswith("__ANON"))


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

    def _start(self, x) -> tuple[int, int]:
        return (x.line, x.column) if isinstance(x, Token) else (x.span.line, x.span.col)

    def _end(self, x) -> tuple[int, int]:
        return (x.end_line, x.end_column) if isinstance(x, Token) else (x.span.end_line, x.span.end_col)

    def _cover(self, children) -> Span:
        (l1, c1), (l2, c2) = self._start(children[0]), self._end(children[-1])
        return Span(self.file, l1, c1, l2, c2)

    @staticmethod
    def _values(children) -> list:
        return [c for c in children if not _is_punct(c)]

    # ------------------------------------------------------------------ leaves
    def _string(self, tok: Token) -> ast.String:
        try:
            json.loads(str(tok))
        except ValueError:
            raise ToAst.Problem(error("E104", f"invalid escape in string {tok}", self._tok_span(tok),
                                      help='strings use JSON escapes: \\" \\\\ \\n \\t \\uXXXX')) from None
        return ast.String(str(tok), self._tok_span(tok))

    def _label(self, x: Token) -> ast.Label:
        if x.type == "STRING":
            return ast.Label(self._string(x).value, True, self._tok_span(x))
        return ast.Label(str(x), False, self._tok_span(x))

    # ------------------------------------------------------------------ rules
    def start(self, items):
        return items

    def block(self, children):
        kind, rest = children[0], children[1:]
        brace = next(i for i, c in enumerate(rest) if isinstance(c, Token) and c.type == "LBRACE")
        labels = [self._label(c) for c in rest[:brace]]
        items = [c for c in rest[brace + 1:] if not isinstance(c, Token)]
        return ast.Block(str(kind), tuple(labels), tuple(items), self._cover(children), self._tok_span(kind))

    def field(self, children):
        key, values = children[0], [c for c in children[2:] if not _is_punct(c)]
        quoted = key.type == "STRING"
        text = self._string(key).value if quoted else str(key)
        return ast.Field(text, quoted, tuple(values), self._cover(children), self._tok_span(key))

    def or_(self, children):
        return ast.Or(tuple(self._values(children)), self._cover(children))

    def and_(self, children):
        return ast.And(tuple(self._values(children)), self._cover(children))

    def not_(self, children):
        return ast.Not(children[-1], self._cover(children))

    def compare(self, children):
        left, op, right = children
        return ast.Compare(left, str(op), right, self._cover(children))

    def in_(self, children):
        return ast.Compare(children[0], "in", children[-1], self._cover(children))

    def not_in(self, children):
        return ast.Compare(children[0], "not_in", children[-1], self._cover(children))

    def bound(self, children):
        return ast.Bound(str(children[0]), children[1], self._cover(children))

    def range(self, children):
        return ast.Range(children[0], children[-1], self._cover(children))

    def list(self, children):
        return ast.ListValue(tuple(self._values(children)), self._cover(children))

    def string(self, children):
        return self._string(children[0])

    def call(self, children):
        return ast.Call(str(children[0]), tuple(self._values(children[1:])), self._cover(children))

    def operand(self, children):  # "(" value ")": parentheses only group
        return children[1]

    def quantity(self, children):
        number = children[0]
        unit = next((str(c) for c in children[1:] if isinstance(c, Token) and c.type == "UNIT"), None)
        of = next((c for c in children[1:] if isinstance(c, ast.Name)), None)
        return ast.Quantity(str(number), unit, of, self._cover(children))

    def dotted(self, children):
        return ast.Name(tuple(str(c) for c in children if c.type == "NAME"), self._cover(children))
