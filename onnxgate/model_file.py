"""Reading an ONNX model from a path or bytes, graph only.

Counting FLOPs and reading the contract need the graph, the shapes and the metadata, never
the weights: a model whose weights live in external data is read without touching them, so
a 6-billion-parameter model is validated without loading 24 GB.
"""

from __future__ import annotations

from pathlib import Path

import onnx
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
    return model


def read_model(source: ModelSource) -> onnx.ModelProto:
    """The model's graph, initializer shapes and metadata, without external weights.

    Raises ModelFileError naming the file and the problem.
    """
    if isinstance(source, bytes):
        return _parse(source, "<model bytes>")
    path = Path(source)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ModelFileError(f"{path}: is a directory, not an ONNX model") from None
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read: {e.strerror}") from None
    return _parse(data, str(path))


def read_model_with_weights(path: str | Path) -> onnx.ModelProto:
    """The full model, external data included (for executing it in onnxruntime)."""
    model = read_model(path)
    try:
        onnx.load_external_data_for_model(model, str(Path(path).parent))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: cannot load the model's external weights: {e}") from None
    return model
