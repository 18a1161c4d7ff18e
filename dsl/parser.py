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

import re
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


@lru_cache(maxsize=1)
def units() -> tuple[str, ...]:
    """The units the grammar knows (its UNIT terminal, a closed set: the one list of them)."""
    m = re.search(r"^UNIT(?:\.\d+)?:\s*/\((.*?)\)\(\?!", _grammar_text(), re.MULTILINE)
    return tuple(u.replace("\\/", "/") for u in m.group(1).split("|")) if m else ()


# how people write the units the language spells otherwise
_UNIT_ALIASES = {
    "sec": "s", "secs": "s", "second": "s", "seconds": "s", "msec": "ms", "millis": "ms", "usec": "us", "nsec": "ns",
    "mins": "min", "minute": "min", "minutes": "min", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "percent": "%", "gbps": "Gbit/s", "mbps": "Mbit/s", "flops": "FLOP", "tflops": "TFLOP/s",
}
# a number, then a word written where its unit goes (a keyword that may follow a number is no unit)
_NUMBER_WORD = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[ \t]*([A-Za-zµ][\w/]*)")
_NOT_UNITS = {"of", "and", "or", "not", "in"}


def _unknown_unit(src: Source, error_at: int) -> Diagnostic | None:
    """A syntax error just after `NUMBER WORD` where WORD is not a unit is that unknown unit:
    the parser took the word for the next field's key (or a block's name) and failed a token
    or two later, so the error is moved back to where the word stands and named."""
    start = src.text.rfind("\n", 0, max(0, src.text.rfind("\n", 0, error_at))) + 1  # this line and the one before
    last = None
    for m in _NUMBER_WORD.finditer(src.text, start, error_at):
        last = m
    if last is None or last.group(1) in _NOT_UNITS or last.group(1) in units():
        return None
    if not re.fullmatch(r"[\s\w-]*", src.text[last.end(1):error_at]):  # only names between the word and the error
        return None
    word = last.group(1)
    line = src.text.count("\n", 0, last.start(1)) + 1
    col = last.start(1) - (src.text.rfind("\n", 0, last.start(1)) + 1) + 1
    best = _UNIT_ALIASES.get(word) or _UNIT_ALIASES.get(word.lower()) or next(
        (u for u in units() if u.lower() == word.lower()), None)
    if best is None:
        from policyc.compiler.meaning import did_you_mean

        best = did_you_mean(word, units())
    hint = f"did you mean `{best}`?" if best else "the units are " + " ".join(units())
    return error("E109", f"unknown unit `{word}`", Span.point(src.name, line, col, len(word)), help=hint)


def _error_offset(e: UnexpectedInput, src: Source) -> int:
    if isinstance(e, UnexpectedToken) and e.token.type != "$END":
        return int(e.token.start_pos) if e.token.start_pos is not None else len(src.text)
    if isinstance(e, UnexpectedCharacters) and e.pos_in_stream is not None:
        return int(e.pos_in_stream)
    return len(src.text)


def _syntax_diagnostic(e: UnexpectedInput, src: Source) -> Diagnostic:
    unit = _unknown_unit(src, _error_offset(e, src))
    if unit is not None:
        return unit
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


MAX_UNIT_REPAIRS = 32  # unknown units reported (and repaired) in one file before the rest waits for the next run


def parse(src: Source) -> tuple[ast.File | None, list[Diagnostic]]:
    """Parse one file. Returns the tree, or None with the syntax error.

    An unknown unit does not end the parse: it is reported (E109), its word is replaced,
    offsets kept, by the unit suggested (or blanks), and the text parsed again, so a file's
    every unknown unit and the later stages' errors come in one run. The tree returned
    then is of the repaired text, and the diagnostics say why it must not be used alone."""
    diags: list[Diagnostic] = []
    text = src.text
    for _ in range(MAX_UNIT_REPAIRS + 1):
        tree, problem, repaired = _parse_once(Source(src.name, text) if text is not src.text else src)
        if problem is None:
            return ast.File(src.name, tree.items, tuple(_scan_comments(src.text))) if tree else None, diags
        diags.append(problem)
        if repaired is None:
            return None, diags
        text = repaired
    return None, diags


def _parse_once(src: Source) -> tuple[ast.File | None, Diagnostic | None, str | None]:
    """(tree, None, None), or (None, the problem, the text with an unknown unit repaired or None)."""
    try:
        parser, builder = _parser()
        with _LOCK:
            builder.begin(src.name)
            try:
                items: list[ast.Block | ast.Field] = parser.parse(src.text)  # type: ignore[assignment]  # the reductions build AST items, not a Tree
            finally:
                builder.depths.clear()
    except UnexpectedInput as e:
        d = _syntax_diagnostic(e, src)
        return None, d, _repair_unit(src, d) if d.code == "E109" else None
    except ToAst.Problem as e:  # a problem found while building a node carries its diagnostic
        return None, e.diagnostic, None
    return ast.File(src.name, tuple(items), ()), None, None


def _repair_unit(src: Source, d: Diagnostic) -> str | None:
    """The text with the unknown unit `d` names replaced in place (same length: every later
    span stays true) by its suggestion when that fits, else by blanks."""
    span = d.span
    if span is None:
        return None
    lines = src.text.split("\n")
    line = lines[span.line - 1]
    start = span.col - 1
    end = span.end_col - 1 if span.end_line == span.line else len(line)
    word = line[start:end]
    m = re.fullmatch(r"did you mean `(.+)`\?", d.help or "")
    fix = m.group(1) if m and len(m.group(1)) <= len(word) else ""
    lines[span.line - 1] = line[:start] + fix.ljust(len(word)) + line[end:]
    return "\n".join(lines)


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
