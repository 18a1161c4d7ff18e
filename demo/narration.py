"""How the demo speaks: numbered sections, one line per fact, and the one error type a
scene raises when the system did not behave as the scenario says."""

from __future__ import annotations

from typing import TextIO


class DemoError(RuntimeError):
    """A step of the demo did not behave as the scenario says."""


class Narrator:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._section = 0

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def head(self, title: str) -> None:
        self._section += 1
        title = f"{self._section}. {title}"
        self.say()
        self.say(f"── {title} " + "─" * max(0, 76 - len(title)))
