"""A parsed request: the typed request variables the rules read.

Values are SI floats for quantities, strings for names, booleans for yes/no; a variable
that is absent (missing header with `missing: ignore`) is simply not in `vars`, which is
what makes rules that read it not apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from policyc.compiler.bundle import Scalar


@dataclass(frozen=True, slots=True)
class Request:
    vars: Mapping[str, Scalar] = field(default_factory=dict)  # read-only by convention: a plain
    # dict because every rule looks variables up on the hot path

    @staticmethod
    def of(values: Mapping[str, Scalar]) -> "Request":
        """A request from already-typed variables (tests, the decision API's typed form)."""
        return Request(dict(values))

    @property
    def tenant(self) -> str | None:
        t = self.vars.get("tenant")
        return t if isinstance(t, str) else None
