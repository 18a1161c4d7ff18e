"""`--run`: execute the model in onnxruntime with profiling and recount the executed nodes.

The static count trusts shape inference; this check does not. The model runs once on
dummy inputs (~100 tokens), graph optimisations off so that executed kernels are the
graph's own nodes, and the profiler records each kernel's real input and output shapes.
Those shapes go through the same counting rules; the recount must equal the static count
at the same size node for node. Only for small models: the weights must be loaded.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .count import count_pinned, count_views, node_label
from .errors import GateError
from .node_view import NodeView
from .pin_shapes import infer_shapes, pin_inputs, strip_weight_data

RUN_TOKENS = 100


class RuntimeCheckError(GateError):
    """The model could not be executed in onnxruntime."""


@dataclass(frozen=True, slots=True)
class NodeMismatch:
    node: str
    op_type: str
    static: int
    executed: int | None  # None: counted statically, never executed


@dataclass(frozen=True, slots=True)
class RuntimeCheck:
    tokens: int
    static_flops: int
    executed_flops: int
    executed_nodes: int
    mismatches: tuple[NodeMismatch, ...]
    problems: tuple[str, ...]  # executed nodes the rules could not count
    run_seconds: float

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.problems and self.static_flops == self.executed_flops


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    for i, n in enumerate(model.graph.node):
        if not n.name:
            n.name = node_label(n, i)
    return model


def _dummy_inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    inits = {i.name for i in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = tuple(d.dim_value for d in tt.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        else:  # token ids, masks, positions: zeros are valid everywhere
            feeds[inp.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _shapes(entries: list[dict[str, list[int]]]) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in next(iter(e.values()))) for e in entries]


def _align(
    names: tuple[str, ...], shapes: list[tuple[int, ...]], initializers: Mapping[str, tuple[int, ...]]
) -> tuple[tuple[int, ...] | None, ...]:
    """Map profiled shapes back onto the node's input slots.

    Profiles leave out absent optional inputs and, for kernels that pre-pack them,
    constant initializers; an initializer's shape is a fact of the file, not inference.
    """
    if len(shapes) == len(names):
        return tuple(shapes)
    out: list[tuple[int, ...] | None] = [None] * len(names)
    k = 0
    for i, name in enumerate(names):
        if not name:
            continue
        known = initializers.get(name)
        if known is not None and (k >= len(shapes) or shapes[k] != known):
            out[i] = known  # left out of the profile (pre-packed constant)
            continue
        if k < len(shapes):
            out[i] = shapes[k]
            k += 1
    if k != len(shapes):  # could not align: leave dynamic slots unresolved (fails closed)
        return tuple(initializers.get(n) if n else None for n in names)
    return tuple(out)


def _profile(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> tuple[list[dict], float]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = str(Path(tmp) / "policyc_run")
        try:
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            t0 = time.perf_counter()
            sess.run(None, dict(feeds))
            elapsed = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several unrelated types
            raise RuntimeCheckError(f"onnxruntime could not run the model: {str(e).splitlines()[0]}") from None
        events = json.loads(Path(sess.end_profiling()).read_text())
    return [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")], elapsed


def run_check(model_with_weights: onnx.ModelProto, *, tokens: int = RUN_TOKENS, dims: Mapping[str, int] | None = None) -> RuntimeCheck:
    """Execute the model once at `tokens` and compare the profiled recount to the static one."""
    pinned = _named(pin_inputs(model_with_weights, tokens, dims=dims, keep_weights=True))
    static = count_pinned(pinned, infer_shapes(strip_weight_data(pinned)), tokens, 1)
    events, elapsed = _profile(pinned, _dummy_inputs(pinned))
    by_name = {n.name: n for n in pinned.graph.node}
    init_dims = {i.name: tuple(i.dims) for i in pinned.graph.initializer}
    views: list[NodeView] = []
    for e in events:
        node = by_name.get(e["name"][: -len("_kernel_time")])
        if node is None:
            continue
        args = e.get("args", {})
        views.append(
            NodeView(
                name=node.name,
                op_type=node.op_type,
                domain=node.domain,
                attrs={a.name: helper.get_attribute_value(a) for a in node.attribute if a.type != onnx.AttributeProto.GRAPH},
                input_names=tuple(node.input),
                inputs=_align(tuple(node.input), _shapes(args.get("input_type_shape", [])), init_dims),
                outputs=_align(tuple(node.output), _shapes(args.get("output_type_shape", [])), {}),
            )
        )
    executed, problems = count_views(views)
    executed_by_name: dict[str, int] = {}
    for c in executed:
        executed_by_name[c.name] = executed_by_name.get(c.name, 0) + c.total()
    mismatches = [
        NodeMismatch(n.name, n.op_type, n.total(), executed_by_name.get(n.name))
        for n in static.nodes
        if n.total() and executed_by_name.get(n.name) != n.total()
    ]
    return RuntimeCheck(
        tokens=tokens,
        static_flops=static.total(),
        executed_flops=sum(executed_by_name.values()),
        executed_nodes=len(views),
        mismatches=tuple(mismatches),
        problems=tuple(problems),
        run_seconds=elapsed,
    )
