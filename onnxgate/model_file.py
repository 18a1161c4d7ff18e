"""Reading an ONNX model from a path or bytes, graph only.

Counting FLOPs and reading the contract need the graph, the shapes and the metadata, never
the weights: a model whose weights live in external data is read without touching them, so
a 6-billion-parameter model is validated without loading 24 GB.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from policyc.compiler import bounded_read
from policyc.compiler import limits
from google.protobuf.message import DecodeError

from .errors import ModelFileError

ModelSource = bytes | str | Path


def source_name(source: ModelSource) -> str:
    """How to name the source in messages."""
    return "<model bytes>" if isinstance(source, bytes) else str(source)


def _parse(data: bytes, origin: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelFileError(f"{origin}: not an ONNX model: protobuf decoding failed ({e})") from None
    # Protobuf accepts many byte strings that are not models (an empty file parses to an
    # empty message); a real model names its IR version and has a graph with nodes.
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelFileError(f"{origin}: not an ONNX model: no IR version or graph in the file")
    if not model.graph.node:
        raise ModelFileError(f"{origin}: not an ONNX model: the graph has no nodes")
    _check_opsets(model, origin)
    _check_input_dims(model, origin)
    return model


def _check_opsets(model: onnx.ModelProto, origin: str) -> None:
    """The default-domain opset must be one this onnx knows: opset 99 would be counted with
    rules written for other semantics."""
    newest = onnx.defs.onnx_opset_version()
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and not 1 <= op.version <= newest:
            raise ModelFileError(f"{origin}: the model imports opset {op.version} of the default domain; "
                                 f"this policyc knows opsets 1 to {newest}")


def _check_input_dims(model: onnx.ModelProto, origin: str) -> None:
    """A fixed input dimension must be positive (0 or −5 were once replaced by the token count)."""
    for inp in model.graph.input:
        if not inp.type.HasField("tensor_type") or not inp.type.tensor_type.HasField("shape"):
            continue
        for i, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value <= 0:
                raise ModelFileError(f"{origin}: input `{inp.name[:64]}` has dimension {i} of size {d.dim_value}; "
                                     "a fixed dimension must be positive (name it to make it dynamic)")


def read_model(source: ModelSource) -> onnx.ModelProto:
    """The model's graph, initializer shapes and metadata, without external weights.

    Raises ModelFileError naming the file and the problem.
    """
    if isinstance(source, bytes):
        return _parse(source, "<model bytes>")
    path = Path(source)
    try:
        data = bounded_read.read_bytes(path, limits.MAX_ONNX_BYTES, "ONNX model")
    except bounded_read.FileRefused as e:
        raise ModelFileError(str(e)) from None
    return _parse(data, str(path))


def read_model_with_weights(path: str | Path) -> onnx.ModelProto:
    """The full model, external data included (for executing it in onnxruntime)."""
    model = read_model(path)
    _check_external_data(model, Path(path).parent, str(path))
    try:
        onnx.load_external_data_for_model(model, str(Path(path).parent))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: cannot load the model's external weights: {e}") from None
    return model


def _check_external_data(model: onnx.ModelProto, base: Path, origin: str) -> None:
    """Every external weight file is a regular file inside the model's folder, and the
    whole is at most `MAX_ONNX_BYTES`: a location naming a FIFO (or a link to /dev/zero)
    would block or exhaust the loader, which reads them without such checks."""
    import os
    import stat

    total = 0
    seen: set[str] = set()
    for init in model.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in init.external_data}
        location = info.get("location", "")
        target = (base / location).resolve()
        if not location or Path(location).is_absolute() or not target.is_relative_to(base.resolve()):
            raise ModelFileError(f"{origin}: weight `{init.name[:64]}` points outside the model's folder ({location[:128]!r})")
        if location in seen:
            continue
        seen.add(location)
        try:
            st = os.stat(target)
        except OSError as e:
            raise ModelFileError(f"{origin}: weight file `{location[:128]}`: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ModelFileError(f"{origin}: weight file `{location[:128]}` is not a regular file")
        total += st.st_size
        if total > limits.MAX_ONNX_BYTES:
            raise ModelFileError(f"{origin}: external weights exceed {limits.MAX_ONNX_BYTES >> 30} GiB")
