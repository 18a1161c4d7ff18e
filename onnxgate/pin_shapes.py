"""Pinning a model's inputs to one request and resolving every tensor's shape.

A contract states FLOPs at a token count; the graph's inputs are usually dynamic
(`batch`, `sequence`). We pin them to batch 1 and the contract's length, then run ONNX
shape inference (with data propagation, so `Shape → Gather → Reshape` chains resolve). For
graphs with onnxruntime contrib ops (`com.microsoft`), which ONNX inference does not know,
onnxruntime's symbolic shape inference runs as well. Only dims, never weight values, are
read: initializers keep their shapes even when their data lives elsewhere.

Pinning convention, per dynamic dim of a graph input: an explicit `dims` override by name
wins; a dim named like `batch` (or the unnamed first dim) is the batch (1); every other
dynamic dim is the token count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx
import onnx.inliner
from onnx import shape_inference

from .errors import CountError
from .fold_shapes import fold_pass, known_constants, with_constants

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShapeMap:
    """Concrete shapes by tensor name; a name absent or None is unresolved."""

    shapes: Mapping[str, Shape | None]

    def get(self, name: str) -> Shape | None:
        return self.shapes.get(name) if name else None


def _dim_value(dim_param: str, index: int, tokens: int, batch: int, dims: Mapping[str, int]) -> int:
    if dim_param in dims:
        return dims[dim_param]
    if "batch" in dim_param.lower() or (index == 0 and not dim_param):
        return batch
    return tokens


STUB_ABOVE = 1 << 16  # elements; larger initializers are weights, kept as shapes only


def strip_weight_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose large initializers keep name, type and dims but no bytes.

    Counting needs shapes only; copying and re-serialising hundreds of megabytes of
    weights through every inference round is what made inline-weight models slow.
    """
    out = onnx.ModelProto()
    for fd, value in model.ListFields():
        if fd.name == "graph":
            continue
        if hasattr(value, "extend"):  # repeated field
            getattr(out, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(out, fd.name).CopyFrom(value)
        else:
            setattr(out, fd.name, value)
    g, src = out.graph, model.graph
    g.name, g.doc_string = src.name, src.doc_string
    for name in ("node", "input", "output", "value_info", "sparse_initializer", "quantization_annotation", "metadata_props"):
        getattr(g, name).extend(getattr(src, name))
    for init in src.initializer:
        n = 1
        for d in init.dims:
            n *= d
        if n <= STUB_ABOVE or init.data_location == onnx.TensorProto.EXTERNAL:
            g.initializer.append(init)
            continue
        stub = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=list(init.dims))
        stub.data_location = onnx.TensorProto.EXTERNAL
        stub.external_data.add(key="location", value="policyc.stripped")
        g.initializer.append(stub)
    return out


def pin_inputs(
    model: onnx.ModelProto, tokens: int, *, batch: int = 1, dims: Mapping[str, int] | None = None, keep_weights: bool = False
) -> onnx.ModelProto:
    """A copy of `model` with local functions inlined and every dynamic input dim fixed;
    weights are left out unless `keep_weights` (to execute the model)."""
    dims = dict(dims or {})
    if keep_weights:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    else:
        out = strip_weight_data(model)
    if out.functions:
        out = onnx.inliner.inline_local_functions(out)
    initializers = {i.name for i in out.graph.initializer}
    for inp in out.graph.input:
        if inp.name in initializers or not inp.type.HasField("tensor_type"):
            continue
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            continue
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            value = _dim_value(d.dim_param, i, tokens, batch, dims)
            d.Clear()
            d.dim_value = value
    return out


def _shape_of(vi: onnx.ValueInfoProto) -> Shape | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    out: list[int] = []
    for d in vi.type.tensor_type.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        out.append(d.dim_value)
    return tuple(out)


def _collect(model: onnx.ModelProto) -> dict[str, Shape | None]:
    g = model.graph
    shapes: dict[str, Shape | None] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        s = _shape_of(vi)
        if s is not None or vi.name not in shapes:
            shapes[vi.name] = s
    for init in g.initializer:
        shapes[init.name] = tuple(init.dims)
    for node in g.node:  # Constant nodes carry their shape in the attribute
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    shapes[node.output[0]] = tuple(a.t.dims)
    return shapes


def _uses_contrib_ops(model: onnx.ModelProto) -> bool:
    return any(n.domain == "com.microsoft" for n in model.graph.node)


def _without_weight_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """Initializers whose data is external become shaped graph inputs: onnxruntime's
    symbolic inference then needs their shapes only, never their bytes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = []
    for init in out.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            out.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    return out


def _symbolic_infer(model: onnx.ModelProto) -> onnx.ModelProto | None:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        return SymbolicShapeInference.infer_shapes(_without_weight_data(model), auto_merge=True, guess_output_rank=False)
    except Exception:  # noqa: BLE001 - a failed fallback leaves shapes unresolved, which fails closed later
        return None


def _onnx_infer(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CountError([f"shape inference failed with the pinned inputs: {first}"]) from None


MAX_FOLD_ROUNDS = 8


def infer_shapes(pinned: onnx.ModelProto) -> ShapeMap:
    """Concrete shapes of every tensor the inference can resolve in a pinned model.

    Rounds of ONNX inference and folding of shape arithmetic (`fold_shapes`) alternate
    until no new value is found; folded values keep their shapes in the map.
    """
    known = known_constants(pinned)
    work = pinned
    shapes = _collect(_onnx_infer(work))
    for _ in range(MAX_FOLD_ROUNDS):
        if not fold_pass(work, shapes.get, known):
            break
        work = with_constants(pinned, known)
        shapes = _collect(_onnx_infer(work))
    for name, value in known.items():
        shapes.setdefault(name, tuple(value.shape))
        if shapes[name] is None:
            shapes[name] = tuple(value.shape)
    if _uses_contrib_ops(pinned):
        sym = _symbolic_infer(work)
        if sym is not None:
            for name, s in _collect(sym).items():
                if s is not None and shapes.get(name) is None:
                    shapes[name] = s
    return ShapeMap(shapes)
