"""Progress on long compiles and verifies: a spinner with the elapsed time on stderr when it
is a terminal (rich), nothing at all otherwise (pipes, CI logs, tests)."""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from typing import Iterator, TextIO


@contextmanager
def progress(label: str, stream: TextIO | None = None) -> Iterator[None]:
    out = stream or sys.stderr
    if not out.isatty():
        with nullcontext():
            yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(file=out), transient=True) as bar:
        bar.add_task(label, total=None)
        yield
