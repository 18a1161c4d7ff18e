"""Errors of the ONNX gate, each naming the place and the problem.

The gate's callers (the CLI, the decision API's `RegisterInstance`) turn these into a
one-line message and an exit code or an `INVALID_ARGUMENT`; none of them may surface as
a traceback. `ContractMetadataError` is the one the decision API relies on: a model without
a complete, intact contract is never registered.
"""

from __future__ import annotations


class GateError(Exception):
    """Base of every error the gate raises for bad input."""


class ModelFileError(GateError):
    """The file or bytes are not a readable ONNX model."""


class ContractMetadataError(GateError):
    """The embedded contract is missing, corrupted, incomplete or off-schema.

    `field` is the dotted path of the offending field (e.g. `memory.bandwidth_min`, or the
    metadata key itself) so machines can point at it without parsing the message.
    """

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class CountError(GateError):
    """FLOPs could not be counted; the count fails closed rather than report a silent zero.

    `problems` lists every node that could not be counted (a run reports all it finds).
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        shown = "; ".join(problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(f"cannot count FLOPs: {shown}{more}")
