"""Reading a file a user named: regular files only, never more than a stated size.

Every command that takes a path (`check`, `compile`, `fmt`, `inspect`, `diff`,
`validate`, `embed`, `test`, `serve`, keys, TLS files) and `ReloadBundle(path=…)` read
through here. A FIFO would block the reader forever (and, on the serving loop, every
Decide with it); `/dev/zero` would be read until the OOM killer came; a directory gives a
traceback in most readers. So the file is opened without blocking (`O_NONBLOCK`: opening a
FIFO with no writer returns at once), refused unless `fstat` says it is a regular file,
refused when larger than the caller's limit, and read at most one byte past that limit
(a file that grows while it is read is refused too).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileRefused(Exception):
    """A path that cannot be read as asked; the message names the path and the reason."""


def _why(e: OSError) -> str:
    text = e.strerror or str(e)
    return text[:1].lower() + text[1:]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _size(n: int) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n} bytes"


def _shown(name: str) -> str:
    """The path as a message shows it: a 1 MB path is cut short, never echoed whole."""
    return name if len(name) <= 256 else name[:256] + "…"


def read_bytes(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The file's bytes, or FileRefused naming `path` and saying why not."""
    name = os.fspath(path)
    shown = _shown(name)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise FileRefused(f"{shown}: cannot read {what}: {_why(e)}") from None
    except (ValueError, UnicodeEncodeError):  # a NUL or a lone surrogate in the name
        raise FileRefused(f"{ascii(shown)}: cannot read {what}: not a valid path") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{shown}: cannot read {what}: it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise FileRefused(f"{shown}: {what} is {_size(st.st_size)}; at most {_size(limit)} is read")
        chunks: list[bytes] = []
        got = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if got > limit:
                raise FileRefused(f"{shown}: {what} is larger than {_size(limit)} (it grew while being read)")
        return b"".join(chunks)
    except OSError as e:
        raise FileRefused(f"{shown}: cannot read {what}: {_why(e)}") from None
    finally:
        os.close(fd)


def read_text(path: str | Path, limit: int, what: str = "file") -> str:
    """The file as UTF-8 text (see `read_bytes`); undecodable bytes are refused with their offset."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileRefused(f"{_shown(os.fspath(path))}: {what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
