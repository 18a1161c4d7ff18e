"""A bad `*_test.toml` reported like the compiler reports a bad contract: every problem at
its `file:line:col`, with the source line, a caret and a "did you mean", cases and
instances counted from 1 (`case 3`) and named (`case 3 (\"finance lands …\")`), in the
project's words instead of pydantic's (`case.2.admitted: Field required`).

The TOML reader keeps no positions, so the place is found in the text: the n-th
`[[case]]` (or `[[instance]]`) header, then the key inside that table (or inside an inline
table on its line); where the key is absent (a missing field), the table's header.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from policyc.compiler.diagnostic import Diagnostic, Span, did_you_mean, error, sort_key

TABLES = {"case": "case", "instance": "instance"}  # array-of-tables key -> the word for one entry
_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*([A-Za-z_][\w-]*)[ \t]*\]\][ \t]*(?:#.*)?$")


def plain(diags: Iterable[Diagnostic]) -> str:
    """The diagnostics one line each, in order (`file:line:col: error[E8xx]: …`); the CLI
    renders them with their source lines from `TestFileError.diagnostics` (the runtime
    never imports `dsl/`, where the renderer lives)."""
    return "\n".join(str(d) for d in sorted(diags, key=sort_key))


def toml_error(path: str, text: str, e: tomllib.TOMLDecodeError) -> Diagnostic:
    """tomllib's message ends `(at line L, column C)`: that place, the words before it."""
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", str(e))
    if m is None:
        m2 = re.search(r"\s*\(at end of document\)$", str(e))
        lines = text.splitlines() or [""]
        words = str(e)[:m2.start()] if m2 else str(e)
        return error("E801", f"not valid TOML: {words}", Span.point(path, len(lines), len(lines[-1]) + 1))
    return error("E801", f"not valid TOML: {str(e)[:m.start()]}", Span.point(path, int(m.group(1)), int(m.group(2))))


def validation_errors(path: str, text: str, raw: dict[str, Any], e: ValidationError, model: type[BaseModel]) -> list[Diagnostic]:
    """One located diagnostic per problem pydantic found."""
    lines = text.split("\n")
    headers: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if m:
            headers.setdefault(m.group(1), []).append(i)
    out = []
    for err in e.errors():
        loc = tuple(err["loc"])
        out.append(_one(path, lines, headers, raw, loc, err, model))
    return out


def _one(path: str, lines: list[str], headers: dict[str, list[int]], raw: dict[str, Any], loc: tuple[Any, ...],
         err: Any, model: type[BaseModel]) -> Diagnostic:
    table, index, rest = (loc[0], loc[1], loc[2:]) if len(loc) >= 2 and isinstance(loc[1], int) else (None, None, loc)
    who = ""
    start, stop = 0, len(lines)
    fields: list[str] = list(model.model_fields)
    if table is not None and index is not None:
        word = TABLES.get(str(table), str(table))
        entry = raw.get(str(table), [])
        name = entry[index].get("name") or entry[index].get("id") if index < len(entry) and isinstance(entry[index], dict) else None
        who = f"{word} {index + 1}" + (f" ({name!r})" if isinstance(name, str) else "") + ": "
        found = headers.get(str(table), [])
        if index < len(found):
            start = found[index]
            later = [h for hs in headers.values() for h in hs if h > start]
            stop = min(later) if later else len(lines)
        sub = model.model_fields.get(str(table))
        fields = _fields_of(sub.annotation) if sub is not None else []
    line, col, width = _place(lines, start, stop, [str(p) for p in rest if not isinstance(p, int)])
    key = ".".join(str(p) for p in rest) or str(table or "")
    kind = err.get("type", "")
    help_ = None
    if kind == "missing":
        message = f"{who}`{key}` is required"
        help_ = f"add `{rest[-1]} = …`" if rest else None
    elif kind == "extra_forbidden":
        entry_word = TABLES.get(str(table), str(table))
        message = f"{who}`{key}` is not a field" + (f" of {'an' if entry_word[0] in 'aeiou' else 'a'} {entry_word}" if table
                                                     else " of a test file")
        if len(rest) == 1 or table is None:
            help_ = did_you_mean(str(rest[-1] if rest else table), fields if table is not None else list(model.model_fields))
    else:
        message = f"{who}`{key}`: {str(err.get('msg', 'invalid')).lower()}"
    return error("E802", message, Span.point(path, line, col, width), help=help_)


def _fields_of(annotation: Any) -> list[str]:
    """The field names of the model a list annotation holds (`list[Case]` -> Case's)."""
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return list(arg.model_fields)
    return []


def _place(lines: list[str], start: int, stop: int, keys: list[str]) -> tuple[int, int, int]:
    """(line, col, width), 1-based, of the deepest of `keys` found in lines[start:stop]; the
    first line of the range (the table's header) when the first key is absent."""
    best = (start + 1, 1 + len(lines[start]) - len(lines[start].lstrip()) if start < len(lines) else 1,
            max(1, len(lines[start].strip())) if start < len(lines) else 1)
    if not keys:
        return best
    for i in range(start, min(stop, len(lines))):
        m = re.match(rf"^[ \t]*{re.escape(keys[0])}[ \t]*=", lines[i])
        if m is None:
            continue
        col = m.start() + len(m.group(0)) - len(m.group(0).lstrip()) + 1
        best = (i + 1, col, len(keys[0]))
        for k in keys[1:]:  # an inline table on the same line: `deployment = { gpu_model = … }`
            inner = re.search(rf"[{{,][ \t]*{re.escape(k)}[ \t]*=", lines[i])
            if inner is None:
                break
            at = inner.start() + 1 + len(inner.group(0)[1:]) - len(inner.group(0)[1:].lstrip())
            best = (i + 1, at + 1, len(k))
        return best
    return best


__all__ = ["plain", "toml_error", "validation_errors"]
