"""Text → syntax tree. The only module that runs lark.

The grammar is lark's (`grammar.lark`); its LALR loop and lexer run in lark-cython, the
same tables driven from C, about twice as fast as lark's pure-Python loop on contracts.

Lark's exceptions never leave this module: syntax errors become `Diagnostic`s with the
position and a human list of what was expected; a problem found while building a node
(`ToAst.Problem`) carries its own diagnostic.

`_parser` reaches into two of lark-cython's attributes (the parse table's states and the
callbacks dict its loop reads) to wire the reductions; both versions are pinned below 0.1 (lark-cython)
and 2 (lark) in `pyproject.toml`, and every parser test fails loudly if that wiring breaks.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from importlib import resources
from pathlib import Path

import lark
import lark_cython
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from . import ast
from .diagnostics import Diagnostic, error
from .source import Source, Span
from .to_ast import ToAst, reduction_callbacks

_EXPECT_WORDS = {
    "NAME": "a name", "STRING": "a string", "NUMBER": "a number", "UNIT": "a unit",
    "LBRACE": "`{`", "RBRACE": "`}`", "LSQB": "`[`", "RSQB": "`]`", "LPAR": "`(`", "RPAR": "`)`",
    "COLON": "`:`", "COMMA": "`,`", "CMP": "a comparison", "DOT": "`.`", "__ANON_0": "`..`",
    "AND": "`and`", "OR": "`or`", "NOT": "`not`", "IN": "`in`", "OF": "`of`", "$END": "end of file",
}


def _grammar_text() -> str:
    local = Path(__file__).resolve().parent.parent / "grammar.lark"
    if local.is_file():
        return local.read_text(encoding="utf-8")
    return resources.files("policyc").joinpath("grammar.lark").read_text(encoding="utf-8")


_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _parser() -> tuple[lark.Lark, ToAst]:
    """One parser whose reductions build AST nodes directly (no parse tree); the builder
    is told which file it is reading before each parse, under `_LOCK`."""
    builder = ToAst("<none>")
    parser = lark.Lark(_grammar_text(), parser="lalr", keep_all_tokens=True, maybe_placeholders=False,
                       _plugins=lark_cython.plugins)
    lalr = parser.parser.parser
    table_rules = {id(arg): arg for actions in lalr._parse_table.states.values()
                   for _action, arg in actions.values() if isinstance(arg, lark.grammar.Rule)}
    for rule in table_rules.values():
        _plain_rule(rule)
    fast = reduction_callbacks(table_rules.values(), builder)
    callbacks = lalr.parser_conf.callbacks  # the dict the LALR loop reads, re-keyed by table rules
    callbacks.clear()
    callbacks.update(fast)
    return parser, builder


class _TableRule(lark.grammar.Rule):
    """A rule of the finished parse table, compared by identity in C.

    The LALR loop compares every reduction's rule with an integer state (`arg !=
    end_state`) and looks it up in the callbacks dict; with lark's `Rule` both run
    Python-level `__eq__`/`__hash__`, and the goto lookup by the rule's name runs
    `Token.__eq__` (lark's rule names are `Token`s). Once the table is built each rule is
    one object, so identity is equality; together these were ~15 % of parsing."""

    __slots__ = ()
    __eq__ = object.__eq__
    __hash__ = object.__hash__


def _plain_rule(rule: lark.grammar.Rule) -> None:
    rule.__class__ = _TableRule
    rule.origin.name = str(rule.origin.name)


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_EXPECT_WORDS.get(t, f"`{t.lower()}`") for t in expected if not t.startswith("_")})
    if not words:
        return ""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _syntax_diagnostic(e: UnexpectedInput, src: Source) -> Diagnostic:
    line, col = getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1
    if isinstance(e, UnexpectedCharacters):
        pos = e.pos_in_stream if e.pos_in_stream is not None else len(src.text)
        ch = src.text[pos] if pos < len(src.text) else ""
        exp = _describe_expected(set(e.allowed or ()))
        return error("E101", f"unexpected character `{ch}`", Span.point(src.name, line, col),
                     help=f"expected {exp}" if exp else None)
    if isinstance(e, UnexpectedEOF):
        lines = src.text.splitlines() or [""]
        exp = _describe_expected(set(e.expected))
        return error("E102", "unexpected end of file", Span.point(src.name, len(lines), len(lines[-1]) + 1),
                     help=f"expected {exp}; is a `}}` missing?" if exp else "is a `}` missing?")
    if isinstance(e, UnexpectedToken):
        tok = e.token
        exp = _describe_expected(set(e.expected))
        if tok.type == "$END":
            lines = src.text.splitlines() or [""]
            return error("E102", "unexpected end of file", Span.point(src.name, len(lines), len(lines[-1]) + 1),
                         help=f"expected {exp}; is a `}}` missing?" if exp else None)
        return error("E103", f"unexpected `{tok}`", Span.point(src.name, tok.line, tok.column, len(str(tok))),
                     help=f"expected {exp}" if exp else None)
    return error("E100", "syntax error", Span.point(src.name, line, col))


def parse(src: Source) -> tuple[ast.File | None, list[Diagnostic]]:
    """Parse one file. Returns the tree, or None with the syntax error."""
    try:
        parser, builder = _parser()
        with _LOCK:
            builder.begin(src.name)
            try:
                items: list[ast.Block | ast.Field] = parser.parse(src.text)  # type: ignore[assignment]  # the reductions build AST items, not a Tree
            finally:
                builder.depths.clear()
    except UnexpectedInput as e:
        return None, [_syntax_diagnostic(e, src)]
    except ToAst.Problem as e:  # a problem found while building a node carries its diagnostic
        return None, [e.diagnostic]
    return ast.File(src.name, tuple(items), tuple(_scan_comments(src.text))), []


def _scan_comments(text: str) -> list[ast.Comment]:
    """Comments (`#` to end of line, outside strings), kept so that `fmt` preserves them."""
    found: list[ast.Comment] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if "#" not in line:  # most lines; the character walk below is only for lines with a `#`
            continue
        in_str = esc = False
        for i, ch in enumerate(line):
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch == "#":
                found.append(ast.Comment(n, line[i:].rstrip()))
                break
    return found
