"""Folding shape arithmetic into constants, so shape inference can see through it.

Exporters compute sizes at run time (`Shape → Slice → Concat → Reshape`, position ids via
`Shape → Range`). ONNX inference propagates such values only partly, and onnxruntime's
symbolic inference reads every initializer's data, which defeats counting without weights.
With the inputs pinned, these values are constants: we evaluate small integer-valued nodes
with the ONNX reference implementation, turn them into initializers, and infer again until
nothing changes. Only nodes whose inputs are known small tensors are evaluated, and only
integer results are kept (sizes, not data); weights are never read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

FOLDABLE: frozenset[str] = frozenset(
    {
        "Shape", "Size", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast", "Add", "Sub",
        "Mul", "Div", "Mod", "Neg", "Equal", "Less", "Greater", "Not", "Where", "Range", "Identity",
        "Reshape", "Min", "Max", "ReduceProd", "ReduceSum", "Abs", "Sqrt", "Floor", "Ceil",
        "ConstantOfShape", "Expand", "Tile", "Constant",
    }
)
MAX_ELEMENTS = 1 << 16  # shape values are small; anything larger is data, not a size


def known_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Small initializers stored inline (never external data)."""
    out: dict[str, np.ndarray] = {}
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL or int(np.prod(init.dims)) > MAX_ELEMENTS:
            continue
        out[init.name] = numpy_helper.to_array(init)
    return out


def _output_bound(node: onnx.NodeProto, inputs: list[np.ndarray | None]) -> float:
    """An upper bound on the elements `node` would produce from these inputs, computed
    *before* evaluating it: a 17 KB model once made `Range` to 1e8 and an `Expand` to a
    gigabyte tensor during folding. Values read here are the (small) known inputs only."""
    known = [a for a in inputs if a is not None]
    try:
        op = node.op_type
        if op == "Range" and len(known) == 3:
            start, limit, delta = (float(np.asarray(a).reshape(-1)[0]) for a in known)
            return float("inf") if delta == 0 else max(0.0, np.ceil((limit - start) / delta))
        if op == "ConstantOfShape" and known:
            return float(np.prod(np.asarray(known[0], dtype=np.float64)))
        if op == "Expand" and len(known) == 2:
            shape = [float(x) for x in np.asarray(known[1]).reshape(-1)]
            data = [float(x) for x in known[0].shape]
            n = max(len(shape), len(data))
            a, b = [1.0] * (n - len(data)) + data, [1.0] * (n - len(shape)) + shape
            return float(np.prod([max(x, y) for x, y in zip(a, b)]))
        if op == "Tile" and len(known) == 2:
            return float(known[0].size) * float(np.prod(np.asarray(known[1], dtype=np.float64)))
        if op == "OneHot" and len(known) >= 2:
            return float(known[0].size) * float(np.asarray(known[1]).reshape(-1)[0])
        if op in ("Pad", "Resize", "Upsample", "Col2Im", "Unique", "Loop", "Scan", "If"):
            return float("inf")  # sizes never need them; never evaluated
        # everything else (pointwise, MatMul, Concat, Gather, Reshape …): at most the sum of
        # the inputs plus their broadcast, both bounded by the known inputs' own sizes
        shapes = [a.shape for a in known]
        rank = max((len(sh) for sh in shapes), default=0)
        dims = [1.0] * rank
        for sh in shapes:
            for i, d in enumerate(sh):
                j = rank - len(sh) + i
                dims[j] = max(dims[j], float(d))
        return float(np.prod(dims)) + sum(float(a.size) for a in known)
    except (ValueError, TypeError, IndexError, OverflowError):
        return float("inf")


def _evaluate(node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    bound = _output_bound(node, inputs)
    if not bound <= MAX_ELEMENTS * max(1, len(node.output)):  # NaN and inf too
        return None  # a size never needs that many elements: it is data, or an attack

    names = list(node.input)
    graph_inputs = [
        numpy_helper.from_array(a, n) for n, a in zip(names, inputs) if n and a is not None
    ]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
    graph = helper.make_graph([node], "fold", [], outs, graph_inputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:
        result = ReferenceEvaluator(model).run(None, {})
    except Exception:  # noqa: BLE001 - an op we cannot fold stays in the graph
        return None
    arrays = [np.asarray(r) for r in result]
    # sizes are integers: a float result (a weight made by ConstantOfShape, a mask) is data
    if any(a.size > MAX_ELEMENTS or not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_) for a in arrays):
        return None
    return arrays


def fold_pass(
    model: onnx.ModelProto, shape_of: Callable[[str], tuple[int, ...] | None], known: dict[str, np.ndarray]
) -> bool:
    """Evaluate every foldable node whose inputs are known; record outputs in `known`."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    changed = False
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in FOLDABLE:
            continue
        if all(o in known for o in node.output if o):
            continue
        if node.op_type == "Shape":
            s = shape_of(node.input[0])
            if s is None:
                continue
            attrs = {a.name: a.i for a in node.attribute}
            start, end = attrs.get("start", 0), attrs.get("end", len(s))
            known[node.output[0]] = np.array(s[start:end] if end is not None else s[start:], dtype=np.int64)
            changed = True
            continue
        if node.op_type == "Size":
            s = shape_of(node.input[0])
            if s is not None:
                known[node.output[0]] = np.array(int(np.prod(s)), dtype=np.int64)
                changed = True
            continue
        if not all((not n) or n in known for n in node.input):
            continue
        result = _evaluate(node, [known.get(n) if n else None for n in node.input], opset)
        if result is None:
            continue
        for name, value in zip([o for o in node.output if o], result):
            known[name] = value
        changed = True
    return changed


def with_constants(model: onnx.ModelProto, known: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy where nodes whose outputs are all known become initializers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    existing = {i.name for i in out.graph.initializer}
    keep: list[onnx.NodeProto] = []
    for node in out.graph.node:
        outs = [o for o in node.output if o]
        if outs and all(o in known for o in outs) and node.op_type in FOLDABLE:
            for o in outs:
                if o not in existing:
                    tensor = numpy_helper.from_array(known[o], o)
                    out.graph.initializer.append(tensor)
                    if out.ir_version < 4:  # before IR 4 every initializer is also a graph input
                        out.graph.input.append(helper.make_tensor_value_info(o, tensor.data_type, list(tensor.dims)))
                    existing.add(o)
            continue
        keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    graph_outputs = {o.name for o in out.graph.output}
    # a folded graph output must still be produced by something: keep it as Identity of itself
    for name in graph_outputs & set(known):
        if not any(name in n.output for n in keep):
            # (a protobuf repeated field takes no slice assignment: rebuild it)
            others = [i for i in out.graph.initializer if i.name != name]
            del out.graph.initializer[:]
            out.graph.initializer.extend(others)
            out.graph.node.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(known[name], name)))
    return out
