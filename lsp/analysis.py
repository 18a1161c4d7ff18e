"""What the language server answers, as plain functions of a document's text and place.

Diagnostics are the compiler's own: the document is compiled with the other `.contract`
files of its folder (names resolve across files, as `policyc check DIR` does), the open
buffer standing in for its file on disk, and the diagnostics located in the document are
returned. The solver's analyses are left to `policyc check` (seconds on a large folder);
as you type, parsing, lowering, value checks and name resolution run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from policyc.compiler.diagnostic import Diagnostic
from policyc.dsl.source import Source

from .reference import field_docs

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_DECL = re.compile(r"^[ \t]*(contract|gpu|policy|breaker|rule|header)[ \t]+([A-Za-z_][\w\-]*)", re.MULTILINE)
_INLINE_RULE = re.compile(r"\brule[ \t]+([A-Za-z_][\w\-]*)")


@dataclass(frozen=True)
class Location:
    path: Path
    line: int  # 0-based, as LSP counts
    col: int


def diagnostics(path: Path, text: str) -> list[Diagnostic]:
    """The compiler's diagnostics for the document at `path` whose buffer is `text`."""
    from policyc.compiler import load
    from policyc.compiler.pipeline import compile_sources

    me = str(path)
    sources = [Source(me, text)]
    if path.parent.is_dir():
        files, _ = load.collect([path.parent])
        for f in files:
            if f.resolve() == path.resolve():
                continue
            src, _ = load.read(f)
            if src is not None:
                sources.append(Source(str(f), src.text))
    result = compile_sources(sources, analyse=False)
    return [d for d in result.diagnostics if d.span is not None and d.span.file == me]


def word_at(text: str, line: int, col: int) -> tuple[str, int, int] | None:
    """(word, start col, end col) under the 0-based position, a dotted name whole."""
    lines = text.split("\n")
    if not 0 <= line < len(lines):
        return None
    for m in _WORD.finditer(lines[line]):
        if m.start() <= col <= m.end():
            return m.group(0), m.start(), m.end()
    return None


def hover(text: str, line: int, col: int) -> str | None:
    """Markdown for the field (or unit) under the cursor: the reference's rows for it."""
    from policyc.dsl.parser import units

    found = word_at(text, line, col)
    if found is None:
        return None
    word = found[0]
    docs = field_docs().get(word)
    if docs:
        rows = "\n".join(f"- in `{d.block}`: {d.text}" for d in docs)
        return f"**`{word}`**\n\n{rows}\n\n(see `policyc docs`)"
    if word in units():
        from policyc.compiler.units import UNITS

        kind, factor = UNITS[word]
        return f"**`{word}`**: a unit of {kind}, {factor:g} in SI"
    return None


def completions(text: str, line: int, col: int) -> list[tuple[str, str]]:
    """(label, kind) pairs: after a number, units; at a key's place, fields; elsewhere the
    names declared in the document (contracts, GPUs, rules, request variables)."""
    from policyc.dsl.parser import units

    lines = text.split("\n")
    before = lines[line][:col] if 0 <= line < len(lines) else ""
    if re.search(r"\d[ \t]*[A-Za-z/%]*$", before):
        return [(u, "unit") for u in units()]
    if re.fullmatch(r"[ \t]*[A-Za-z_]*", before) or re.search(r"[{][ \t]*[A-Za-z_]*$", before):
        return [(f, "field") for f in sorted(field_docs())]
    names = {m.group(2) for m in _DECL.finditer(text)} | set(_INLINE_RULE.findall(text))
    names |= set(re.findall(r"\bvar:[ \t]*([A-Za-z_]\w*)", text))
    return [(n, "name") for n in sorted(names)]


def definition(path: Path, text: str, line: int, col: int) -> Location | None:
    """Where the model or rule named under the cursor is declared: this document first,
    then the other `.contract` files of its folder."""
    found = word_at(text, line, col)
    if found is None:
        return None
    name = found[0].split(".")[-1]
    candidates = [(path, text)]
    if path.parent.is_dir():
        for f in sorted(path.parent.glob("*.contract")):
            if f.resolve() != path.resolve():
                try:
                    candidates.append((f, f.read_text(encoding="utf-8")))
                except (OSError, UnicodeDecodeError):
                    continue
    pattern = re.compile(rf"\b(contract|gpu|rule|breaker|policy)[ \t]+({re.escape(name)})(?![\w\-])")
    for p, t in candidates:
        m = pattern.search(t)
        if m:
            at = m.start(2)
            return Location(p, t.count("\n", 0, at), at - (t.rfind("\n", 0, at) + 1))
    return None


def formatted(path: Path, text: str) -> str | None:
    """The document as `policyc fmt` writes it, or None when it does not parse."""
    from policyc.dsl.parser import parse
    from policyc.dsl.printer import format_file

    tree, diags = parse(Source(str(path), text))
    if tree is None or any(d.is_error for d in diags):
        return None
    return format_file(tree)
