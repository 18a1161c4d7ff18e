"""Real model servers for the data plane: KServe (0.21) serving ONNX models with
onnxruntime over the Open Inference Protocol — v2 gRPC (HTTP/2, what the gateway sends
upstream) and v2 REST — each answer saying which registered instance answered.

Modules (import what you need; only `serve`, `onnx_model` and `zygote` import KServe):

- `wire`         header, metadata and parameter names (read this first)
- `model_files`  the ONNX files served: real transformer graphs with their contract
                 embedded, `full` and `simplified` variants (`write_model_files`)
- `specs`        `InstanceSpec`, `ServerSpec` (a process's command line) and
                 `ServingInstance` (`.endpoint` = "127.0.0.1:port" of its gRPC server)
- `launcher`     start/stop real server processes on loopback (each instance its own
                 gRPC port = its endpoint; one REST port per process): `ModelPool`,
                 `ModelServerProcess` (the specs are importable from here too)
- `zygote`, `forked`  a pool of several processes forks them from one interpreter that
                 imported KServe once (a second of CPU saved per process)
- `client`       `OipClient`, `infer_request`, `parse_answer`, `token_ids`, `Answer`,
                 REST helpers `rest_body` / `parse_rest_answer`
- `oip`          KServe's OIP messages without importing KServe (`pb`), a client
                 stub (`InferenceStub`), `MODEL_INFER_PATH`
- `onnx_model`   `OnnxModel`, the `kserve.Model` subclass (onnxruntime, stall control,
                 retry → simplified variant)
- `serve`        one server process: KServe's DataPlane, RESTServer and gRPC servicer
- `command`      `python -m policyc.modelserver` / `policyc modelserver`
- `bounds`       what one request may ask (sequence, batch x sequence <= the contract's
                 tokens, tensor bytes, answer bytes from the output shape), checked
                 before any decode or compute; `rest_guard` holds REST bodies to them in
                 front of FastAPI (413 / 400), `refusals` makes a client's error one log
                 line and its status (gRPC INVALID_ARGUMENT …)

A pool for tests, the demo and the gateway:

    from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
    from policyc.modelserver.model_files import write_model_files
    from policyc.modelserver.client import OipClient, token_ids

    full = write_model_files(bundle.contract("fraud-scorer"), tmp)
    lite = write_model_files(bundle.contract("fraud-scorer-lite"), tmp, simplified=True)
    pool = ModelPool([
        ServerSpec((InstanceSpec("fraud-scorer@host-01/gpu0", full.full),), stall_control=True),
        ServerSpec((InstanceSpec("fraud-scorer-lite@host-02/gpu1", lite.full, lite.simplified,
                                 name="fraud-scorer-lite", aliases=("fraud-scorer",)),)),
    ]).start()                      # processes spawned in parallel, ServerReady/ModelReady checked
    pool.endpoint("fraud-scorer@host-01/gpu0")          # "127.0.0.1:40123"
    with OipClient(pool.endpoint("fraud-scorer@host-01/gpu0")) as c:
        a = c.infer("fraud-scorer", token_ids(16))      # a.instance, a.variant, a.compute_us
    pool.stop()                     # SIGTERM, every process gone

Request metadata the servers read: `x-retry-count` (>= 1: a retry), `x-envoy-attempt-count`
(>= 2: a retry), `x-policyc-stall-ms` (with `stall_control` only, first attempts only).
Response metadata (gRPC initial metadata = HTTP/2 response headers; REST headers) and OIP
parameters they write: `x-policyc-instance` / `policyc.instance`, `x-policyc-variant` /
`policyc.variant` (`full` | `simplified`), `x-policyc-compute-us` / `policyc.compute_us`
(onnxruntime run time), `x-policyc-retry-count`, `x-policyc-stalled-ms`.

A backup answers the primary's request body (Envoy retries the same bytes, model name
included), so a backup instance lists the primary's model name in `aliases`; on a retry it
serves its `simplified` variant. Prometheus metrics at `GET /metrics` on the REST port:
KServe's `request_predict_seconds{model_name}` and policyc's
`policyc_modelserver_answers_total{model_name,instance,variant}`,
`policyc_modelserver_stalls_total{instance}`, `policyc_modelserver_cancelled_total{instance}`
(streams the caller reset before the answer: the budget breaks) and
`policyc_modelserver_compute_seconds{instance,variant}`.
"""
