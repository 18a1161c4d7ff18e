"""LALR reductions → `ast` nodes, with spans. Used only by `parser.py`.

The node builders run inside the LALR parser as its reduction callbacks, so no
intermediate parse tree is built: each rule's builder receives its children — with every
token kept, punctuation included — and a node's span is the cover of its first and last
token. That makes the front end about twice as fast as building a tree with positions and
walking it afterwards, which matters when thousands of contracts compile together.

`reduction_callbacks` wires the builders to the grammar's rules directly rather than
through a lark `Transformer`, whose generic wrappers cost a Python call per reduction:
a rule that only passes its one child up (`?value: and_expr`) reduces with a C-level
`itemgetter`, and the helper rules lark makes for repetitions (`item*`) reduce to flat
lists that their parent's builder splices in. Tokens come from lark-cython's lexer
(`lark_cython.Token`: not a `str`, so values are read from `.value`).
"""

from __future__ import annotations

import json
from operator import itemgetter
from typing import Callable, Iterable

from lark.grammar import Rule
from lark_cython import Token

from policyc.compiler import limits

from . import ast
from .diagnostics import Diagnostic, error
from .source import Span

_PUNCT = {"LBRACE", "RBRACE", "LSQB", "RSQB", "LPAR", "RPAR", "COLON", "COMMA", "DOT", "OR", "AND", "NOT", "IN", "OF"}


def _is_punct(x) -> bool:
    return type(x) is Token and (x.type in _PUNCT or x.type.startswith("__ANON"))


class ToAst:
    class Problem(Exception):
        def __init__(self, diagnostic: Diagnostic) -> None:
            super().__init__(diagnostic.message)
            self.diagnostic = diagnostic

    def __init__(self, file: str) -> None:
        self.file = file
        # nesting depth of the compound nodes built so far in this parse, by id (the tree
        # holds every node until the parse ends, so ids are not reused); leaves are depth 0
        self.depths: dict[int, int] = {}

    def begin(self, file: str) -> None:
        self.file = file
        self.depths.clear()

    # ------------------------------------------------------------------ limits
    def _nest(self, node, children, span_children):  # type: ignore[no-untyped-def]
        """Record `node`'s depth (one more than its deepest child); refuse past the limit,
        so that no later pass (printer, checker, solver, serialiser) can be made to recurse
        without bound."""
        depths = self.depths
        d = 1 + max((depths.get(id(c), 0) for c in children), default=0)
        if d > limits.MAX_DEPTH:
            raise ToAst.Problem(error("E105", f"nested more than {limits.MAX_DEPTH} levels deep",
                                      self._cover(span_children), help="split the expression or the block"))
        depths[id(node)] = d
        return node

    def _width(self, values, children, what: str) -> None:  # type: ignore[no-untyped-def]
        if len(values) > limits.MAX_TERMS:
            raise ToAst.Problem(error("E106", f"{what} of {len(values):,} terms; at most {limits.MAX_TERMS:,} are allowed",
                                      self._cover(children[:1]), help="split it into several rules or lists"))

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
        if len(tok.value) > limits.MAX_STRING_CHARS:
            raise ToAst.Problem(error("E107", f"string of {len(tok.value):,} characters; at most {limits.MAX_STRING_CHARS:,} are allowed",
                                      Span.point(self.file, tok.line, tok.column)))
        try:
            value = json.loads(tok.value)
        except ValueError:
            raise ToAst.Problem(error("E104", f"invalid escape in string {tok.value[:64]}", self._tok_span(tok),
                                      help='strings use JSON escapes: \\" \\\\ \\n \\t \\uXXXX')) from None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ToAst.Problem(error("E104", "string holds a lone surrogate (`\\uD800`–`\\uDFFF` not in a pair)",
                                      self._tok_span(tok), help="write the character itself, or both halves of the pair")) from None
        return ast.String(tok.value, self._tok_span(tok))

    def _label(self, x: Token) -> ast.Label:
        if x.type == "STRING":
            return ast.Label(self._string(x).value, True, self._tok_span(x))
        return ast.Label(x.value, False, self._tok_span(x))

    # ------------------------------------------------------------------ rules
    def start(self, items):
        return items

    def block(self, children):  # NAME label* "{" item* "}"
        kind, brace = children[0], 1
        while type(children[brace]) is not Token or children[brace].type != "LBRACE":
            brace += 1
        labels = tuple(self._label(c) for c in children[1:brace])
        items = tuple(children[brace + 1:-1])
        node = ast.Block(kind.value, labels, items, self._cover(children), self._tok_span(kind))
        return self._nest(node, items, children[:1])

    def field(self, children):  # key ":" value ("," value)*
        key = children[0]
        quoted = key.type == "STRING"
        text = self._string(key).value if quoted else key.value
        values = tuple(children[2::2])
        self._width(values, children, "a field")
        node = ast.Field(text, quoted, values, self._cover(children), self._tok_span(key))
        self.depths[id(node)] = max((self.depths.get(id(v), 0) for v in values), default=0)
        return node

    def or_(self, children):
        values = self._values(children)
        self._width(values, children, "an `or`")
        return self._nest(ast.Or(tuple(values), self._cover(children)), values, children)

    def and_(self, children):
        values = self._values(children)
        self._width(values, children, "an `and`")
        return self._nest(ast.And(tuple(values), self._cover(children)), values, children)

    def not_(self, children):
        return self._nest(ast.Not(children[-1], self._cover(children)), children[-1:], children)

    def compare(self, children):
        left, op, right = children
        return self._nest(ast.Compare(left, op.value, right, self._cover(children)), (left, right), children)

    def in_(self, children):
        node = ast.Compare(children[0], "in", children[-1], self._cover(children))
        return self._nest(node, (children[0], children[-1]), children)

    def not_in(self, children):
        node = ast.Compare(children[0], "not_in", children[-1], self._cover(children))
        return self._nest(node, (children[0], children[-1]), children)

    def bound(self, children):
        return self._nest(ast.Bound(children[0].value, children[1], self._cover(children)), children[1:2], children)

    def range(self, children):
        return ast.Range(children[0], children[-1], self._cover(children))

    def list(self, children):
        values = self._values(children)
        self._width(values, children, "a list")
        return self._nest(ast.ListValue(tuple(values), self._cover(children)), values, children)

    def string(self, children):
        return self._string(children[0])

    def call(self, children):
        values = self._values(children[1:])
        self._width(values, children, "a call")
        return self._nest(ast.Call(children[0].value, tuple(values), self._cover(children)), values, children)

    def operand(self, children):  # "(" value ")": parentheses only group
        return children[1]

    def quantity(self, children):  # NUMBER UNIT? ("of" dotted)?
        n = len(children)
        if len(children[0].value) > limits.MAX_NUMBER_CHARS:
            raise ToAst.Problem(error("E108", f"number of {len(children[0].value):,} characters; at most {limits.MAX_NUMBER_CHARS} are allowed",
                                      self._tok_span(children[0])))
        unit = children[1].value if n in (2, 4) else None
        of = children[-1] if n >= 3 else None
        return ast.Quantity(children[0].value, unit, of, self._cover(children))

    def dotted(self, children):  # NAME ("." NAME)*
        return ast.Name(tuple(c.value for c in children[::2]), self._cover(children))


# --------------------------------------------------------------------------- wiring

def reduction_callbacks(rules: Iterable[Rule], builder: ToAst) -> dict[Rule, Callable[[list], object]]:
    """The callback for each grammar rule: what the LALR loop calls with a reduction's
    children (a fresh list) to get the value it pushes."""
    return {rule: _callback(rule, builder) for rule in rules}


def _callback(rule: Rule, builder: ToAst) -> Callable[[list], object]:
    name = rule.alias or rule.origin.name
    symbols = [s.name for s in rule.expansion]
    spliced = tuple(i for i, s in enumerate(rule.expansion) if not s.is_term and _is_repetition(s.name))
    if _is_repetition(name):  # `x*` helper: base case [x], or [helper, x...] growing the list
        return _grow if spliced == (0,) else list
    if rule.options.expand1 and len(symbols) == 1 and rule.alias is None:
        return itemgetter(0)  # `?rule` with one child: the child itself
    build = getattr(builder, name)
    if not spliced:
        return build
    return lambda children: build(_splice(children, spliced))


def _is_repetition(name: str) -> bool:
    """lark names the rules it makes for `*`/`+` repetitions `__<rule>_star_N`/`_plus_N`."""
    return name.startswith("__")


def _grow(children: list) -> list:
    acc = children[0]
    acc += children[1:]
    return acc


def _splice(children: list, at: tuple[int, ...]) -> list:
    out: list = []
    for i, c in enumerate(children):
        if i in at:
            out += c
        else:
            out.append(c)
    return out
