"""Text → syntax tree. The only module that runs lark.

The grammar is lark's (`grammar.lark`); its LALR loop and lexer run in lark-cython, the
same tables driven from C, about twice as fast as lark's pure-Python loop on contracts.

Lark's exceptions never leave this module: syntax errors become `Diagnostic`s with the
position and a human list of what was expected; anything raised inside the transformer
arrives as `VisitError` and is unwrapped here.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from importlib import resources
from pathlib import Path

import lark
import lark_cython
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from . import ast
from .diagnostics import Diagnostic, error
from .source import Source, Span
from .to_ast import ToAst

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
    """One parser whose callbacks build AST nodes directly (no parse tree); the callbacks'
    transformer is told which file it is reading before each parse, under `_LOCK`."""
    builder = ToAst("<none>")
    return lark.Lark(_grammar_text(), parser="lalr", keep_all_tokens=True, maybe_placeholders=False,
                     transformer=builder, _plugins=lark_cython.plugins), builder


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_EXPECT_WORDS.get(t, f"`{t.lower()}`") for t in expected if not t.startswith("_")})
    if not words:
        return ""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _syntax_diagnostic(e: UnexpectedInput, src: Source) -> Diagnostic:
    line, col = getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1
    if isinstance(e, UnexpectedCharacters):
        ch = src.text[e.pos_in_stream] if e.pos_in_stream < len(src.text) else ""
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
            builder.file = src.name
            items = parser.parse(src.text)
    except UnexpectedInput as e:
        return None, [_syntax_diagnostic(e, src)]
    except ToAst.Problem as e:  # a problem found while building a node carries its diagnostic
        return None, [e.diagnostic]
    except VisitError as e:
        if isinstance(e.orig_exc, ToAst.Problem):
            return None, [e.orig_exc.diagnostic]
        raise
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
