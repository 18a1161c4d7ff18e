"""The Open Inference Protocol v2 gRPC stubs, as KServe ships them
(`kserve.protocol.grpc.grpc_predict_v2_pb2(_grpc)`, service `inference.GRPCInferenceService`).

Importing KServe parses `sys.argv` (its `model_server` module does at import), which could
read a host program's own options as KServe's; the import here sees an empty command line.
"""

from __future__ import annotations

import sys

_argv = sys.argv
sys.argv = _argv[:1]
try:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc
finally:
    sys.argv = _argv

SERVICE = "inference.GRPCInferenceService"
MODEL_INFER_PATH = f"/{SERVICE}/ModelInfer"

__all__ = ["MODEL_INFER_PATH", "SERVICE", "pb", "pb_grpc"]
