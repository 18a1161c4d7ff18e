"""Real model servers for the data plane: KServe ModelServers serving ONNX models with
onnxruntime over the Open Inference Protocol (v2 REST and gRPC)."""
