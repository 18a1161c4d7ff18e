"""Finding and reading policy files.

A directory argument means the `.contract` files directly in it, in name order (areas such
as `policies/broken/` are compiled only when named). File names are kept as the user gave
them, relative when possible, so bundles and diagnostics carry no absolute paths.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Sequence

from . import limits
from policyc.dsl.diagnostics import Diagnostic, error
from policyc.dsl.source import Source, Span

from . import bounded_read

EXTENSION = ".contract"


def display_name(path: Path) -> str:
    try:
        rel = Path(os.path.relpath(path.resolve(), Path.cwd()))
        return rel.as_posix() if not rel.as_posix().startswith("../..") else path.as_posix()
    except ValueError:
        return path.as_posix()


def is_directory(path: Path) -> bool:
    """`path.is_dir()` that is False, not a PermissionError, when a parent cannot be
    searched (the reader that follows reports that path as E001)."""
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return False


def collect(paths: Sequence[str | Path]) -> tuple[list[Path], list[Diagnostic]]:
    files: list[Path] = []
    diags: list[Diagnostic] = []
    for raw in paths:
        p = Path(raw)
        try:
            st = p.stat()
        except (FileNotFoundError, NotADirectoryError):
            diags.append(error("E001", f"no such file or directory `{p.as_posix()}`", None))
            continue
        except OSError as e:  # a parent the user cannot search (EACCES), a loop, a name too long
            diags.append(error("E001", f"cannot read `{p.as_posix()}`: {e.strerror or e}", None))
            continue
        except ValueError:  # a NUL byte: no file can have that name
            shown = p.as_posix().encode("unicode_escape").decode("ascii")
            diags.append(error("E001", f"no such file or directory `{shown}` (a path cannot hold a NUL byte)", None))
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                found = sorted(q for q in p.iterdir() if q.suffix == EXTENSION and q.is_file())
            except OSError as e:
                diags.append(error("E001", f"cannot list directory `{p.as_posix()}`: {e.strerror or e}", None))
                continue
            if not found:
                diags.append(error("E003", f"no `{EXTENSION}` files in `{p.as_posix()}`", None))
            files.extend(found)
        else:  # a FIFO or a device is refused when read, with its kind named
            files.append(p)
    unique: list[Path] = []
    seen: set[Path] = set()
    for f in files:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append(f)
    return unique, diags


def read(path: Path) -> tuple[Source | None, list[Diagnostic]]:
    name = display_name(path)
    try:
        data = bounded_read.read_bytes(path, limits.MAX_SOURCE_BYTES, "policy source")
    except bounded_read.FileRefused as e:
        return None, [error("E004" if "at most" in str(e) or "larger" in str(e) else "E001", str(e), None)]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = before.count(b"\n") + 1
        col = len(before) - (before.rfind(b"\n") + 1) + 1
        return None, [error("E002", f"`{name}` is not UTF-8 text (byte 0x{data[e.start]:02x})", Span.point(name, line, col))]
    return Source(name, text), []
