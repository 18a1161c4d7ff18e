"""Pausing Python's cyclic garbage collector around large, acyclic allocations.

Compiling thousands of contracts, writing a large bundle or building the matcher's index
allocates millions of small objects that never form cycles; the collector would rescan them
generation after generation with nothing to free, making such steps up to quadratic.
Reference counting still frees everything while the collector is paused.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
