"""The Open Inference Protocol v2 gRPC messages as KServe ships them
(`kserve/protocol/grpc/grpc_predict_v2_pb2.py`, service `inference.GRPCInferenceService`),
and a client stub for the calls policyc makes.

Clients (the launcher's readiness checks, the OIP client, the demo, the gateway's tests
and benchmark) need the messages, not KServe: importing the `kserve` package pulls in
pandas, FastAPI and the Kubernetes client (about a second of CPU) and parses `sys.argv`.
So KServe's generated module is loaded from its file on its own. The classes are the very
ones `import kserve.protocol.grpc.grpc_predict_v2_pb2` gives later in the same process
(protobuf keeps one class per descriptor of the default pool), so the servers, which do
import KServe, and these clients speak the same types. Where the file is not found (another
KServe layout), the package is imported the ordinary way, with `sys.argv` shielded.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import grpc

SERVICE = "inference.GRPCInferenceService"
MODEL_INFER_PATH = f"/{SERVICE}/ModelInfer"
_MODULE = "kserve.protocol.grpc.grpc_predict_v2_pb2"


def _load() -> ModuleType:
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    spec = importlib.util.find_spec("kserve")
    origin = spec.origin if spec is not None else None
    if origin is not None:
        path = origin.rsplit("/", 1)[0] + "/protocol/grpc/grpc_predict_v2_pb2.py"
        file_spec = importlib.util.spec_from_file_location("policyc.modelserver._oip_pb2", path)
        if file_spec is not None and file_spec.loader is not None:
            try:
                module = importlib.util.module_from_spec(file_spec)
                file_spec.loader.exec_module(module)
                return module
            except FileNotFoundError:
                pass
    argv, sys.argv = sys.argv, sys.argv[:1]  # KServe's model_server module parses sys.argv at import
    try:
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as shipped
    finally:
        sys.argv = argv
    return shipped


pb: Any = _load()


class InferenceStub:
    """The client side of `inference.GRPCInferenceService`, for the calls policyc makes."""

    def __init__(self, channel: grpc.Channel) -> None:
        def method(name: str, request: Any, response: Any) -> grpc.UnaryUnaryMultiCallable:
            return channel.unary_unary(f"/{SERVICE}/{name}", request_serializer=request.SerializeToString,
                                       response_deserializer=response.FromString)

        self.ServerLive = method("ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse)
        self.ServerReady = method("ServerReady", pb.ServerReadyRequest, pb.ServerReadyResponse)
        self.ModelReady = method("ModelReady", pb.ModelReadyRequest, pb.ModelReadyResponse)
        self.ServerMetadata = method("ServerMetadata", pb.ServerMetadataRequest, pb.ServerMetadataResponse)
        self.ModelMetadata = method("ModelMetadata", pb.ModelMetadataRequest, pb.ModelMetadataResponse)
        self.ModelInfer = method("ModelInfer", pb.ModelInferRequest, pb.ModelInferResponse)


__all__ = ["MODEL_INFER_PATH", "SERVICE", "InferenceStub", "pb"]
