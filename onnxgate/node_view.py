"""What a counting rule sees of one node: its op, attributes and concrete shapes.

Rules read shapes through `NodeView` so that the static count (shapes from inference) and
the runtime recount (shapes onnxruntime's profiler recorded) go through the very same
rules. A rule that asks for a shape that is unresolved gets `UnresolvedShape`, which the
counter reports as an error: a compute node is never silently counted as zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Shape = tuple[int, ...]


class UnresolvedShape(Exception):
    """A rule needed a shape the inference (or the profile) did not resolve."""


class UnsupportedNode(Exception):
    """The op has a rule, but not for this attribute or layout combination."""


@dataclass(frozen=True, slots=True)
class OpFlops:
    """FLOPs of one node, split so one pass serves both conventions: `matmul` holds the
    multiply-accumulate work of matrix-class ops (2 FLOPs per MAC), `other` the rest."""

    matmul: int = 0
    other: int = 0

    def __add__(self, o: OpFlops) -> OpFlops:
        return OpFlops(self.matmul + o.matmul, self.other + o.other)


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    op_type: str
    domain: str  # "" for the default ONNX domain
    attrs: Mapping[str, Any]
    input_names: tuple[str, ...]
    inputs: tuple[Shape | None, ...]
    outputs: tuple[Shape | None, ...]

    def has_input(self, i: int) -> bool:
        return i < len(self.input_names) and bool(self.input_names[i])

    def inp(self, i: int) -> Shape:
        if not self.has_input(i):
            raise UnresolvedShape(f"input {i} is absent")
        s = self.inputs[i]
        if s is None:
            raise UnresolvedShape(f"shape of input {i} `{self.input_names[i]}` is unresolved")
        return s

    def out(self, i: int = 0) -> Shape:
        s = self.outputs[i] if i < len(self.outputs) else None
        if s is None:
            raise UnresolvedShape(f"shape of output {i} is unresolved")
        return s

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


def numel(shape: Shape) -> int:
    return math.prod(shape)
