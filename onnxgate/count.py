"""Counting a model's FLOPs from its graph at one request's size.

The count is authoritative (wall time on a noisy CPU cannot be turned into FLOPs) and
fails closed: a compute op with no rule, a node whose shapes stay unresolved, or a layout a
rule does not support stops the count with every such node named. Two conventions come
from one pass: `matmul` (matrix-class work only, 2 FLOPs per multiply-accumulate) and
`all` (plus element-wise, normalisation, softmax, pooling and reductions, see
`rules_pointwise`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import onnx
from onnx import helper

from .errors import CountError
from .node_view import NodeView, OpFlops, UnresolvedShape, UnsupportedNode
from .pin_shapes import ShapeMap, infer_shapes, pin_inputs
from .rule_table import is_zero_cost, rule_for


class Convention(StrEnum):
    MATMUL = "matmul"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class NodeCount:
    name: str
    op_type: str
    domain: str
    flops: OpFlops

    def total(self, convention: Convention = Convention.ALL) -> int:
        return self.flops.matmul + (self.flops.other if convention is Convention.ALL else 0)


@dataclass(frozen=True, slots=True)
class FlopCount:
    """FLOPs of one request (batch, tokens) node by node."""

    tokens: int
    batch: int
    nodes: tuple[NodeCount, ...]

    def total(self, convention: Convention = Convention.ALL) -> int:
        return sum(n.total(convention) for n in self.nodes)

    def by_op_type(self, convention: Convention = Convention.ALL) -> list[tuple[str, int]]:
        """Op types with their FLOPs, largest first (zero-cost ops left out)."""
        acc: dict[str, int] = defaultdict(int)
        for n in self.nodes:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            acc[key] += n.total(convention)
        return sorted(((k, v) for k, v in acc.items() if v), key=lambda kv: (-kv[1], kv[0]))

    def top_nodes(self, k: int = 5, convention: Convention = Convention.ALL) -> list[NodeCount]:
        return sorted((n for n in self.nodes if n.total(convention)), key=lambda n: -n.total(convention))[:k]


def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index}:{node.op_type}"


def view_of(node: onnx.NodeProto, label: str, shapes: ShapeMap) -> NodeView:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.type != onnx.AttributeProto.GRAPH}
    return NodeView(
        name=label,
        op_type=node.op_type,
        domain=node.domain,
        attrs=attrs,
        input_names=tuple(node.input),
        inputs=tuple(shapes.get(i) for i in node.input),
        outputs=tuple(shapes.get(o) for o in node.output),
    )


def count_views(views: Iterable[NodeView]) -> tuple[list[NodeCount], list[str]]:
    """Apply the rules; return the counts and the problems (nodes that could not be counted)."""
    counts: list[NodeCount] = []
    problems: list[str] = []
    for v in views:
        where = f"node `{v.name}` ({v.op_type})"
        if is_zero_cost(v.domain, v.op_type):
            counts.append(NodeCount(v.name, v.op_type, v.domain, OpFlops()))
            continue
        rule = rule_for(v.domain, v.op_type)
        if rule is None:
            dom = f" in domain `{v.domain}`" if v.domain not in ("", "ai.onnx") else ""
            problems.append(f"{where}: op `{v.op_type}`{dom} has no counting rule")
            continue
        try:
            counts.append(NodeCount(v.name, v.op_type, v.domain, rule(v)))
        except UnresolvedShape as e:
            problems.append(f"{where}: {e}")
        except UnsupportedNode as e:
            problems.append(f"{where}: unsupported form: {e}")
        except (IndexError, ValueError, ZeroDivisionError) as e:
            problems.append(f"{where}: shapes do not fit the op ({e})")
    return counts, problems


def count_pinned(pinned: onnx.ModelProto, shapes: ShapeMap, tokens: int, batch: int) -> FlopCount:
    views = [view_of(n, node_label(n, i), shapes) for i, n in enumerate(pinned.graph.node)]
    counts, problems = count_views(views)
    if problems:
        raise CountError(problems)
    return FlopCount(tokens=tokens, batch=batch, nodes=tuple(counts))


def count_flops(model: onnx.ModelProto, tokens: int, *, batch: int = 1, dims: Mapping[str, int] | None = None) -> FlopCount:
    """FLOPs of one request: inputs pinned to `batch` and `tokens` (see `pin_shapes`).

    Needs the graph and initializer shapes only, never weight values. Raises CountError
    naming every node that could not be counted.
    """
    if tokens <= 0:
        raise CountError([f"token count must be positive, got {tokens}"])
    pinned = pin_inputs(model, tokens, batch=batch, dims=dims)
    return count_pinned(pinned, infer_shapes(pinned), tokens, batch)
