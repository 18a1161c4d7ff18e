"""The names a policyc model server reads from requests and writes into answers.

One place for them, so the server, the OIP client helper, the gateway and the tests agree.
Header names are lower case: gRPC metadata keys and HTTP/2 header names are lower case on
the wire, and the REST server receives them lower-cased too.

Request metadata / headers the server reads:

- `x-retry-count` — the contract's redirect header (`X-Retry-Count: "1"`). A request
  carrying a value >= 1 is a retry; a backup instance answers it with its simplified
  variant.
- `x-envoy-attempt-count` — Envoy's own attempt counter (route option
  `include_request_attempt_count`); a value >= 2 is a retry too, so a retry that Envoy
  makes of its own accord on a per-try timeout is recognised even when no one rewrote the
  request's headers.
- `x-policyc-stall-ms` — hold this request that many milliseconds before computing (an
  asyncio sleep: the stream stays open, siblings on the same connection go on). Honoured
  only by a server started with stall control (`--stall-control`), and never on a retry:
  it models the primary's GPU slowing under that one request.
- `x-policyc-decision-id` — the picker's decision id (the gateway adds it); logged with
  the answer and echoed as the parameter `policyc.decision_id`, so the model server's own
  record ties each call to the decision that sent it.

Response metadata / headers the server writes (gRPC initial metadata, HTTP response
headers), and the same facts as OIP response parameters (`policyc.*`):

- `x-policyc-instance` / `policyc.instance` — the registered instance id that answered.
- `x-policyc-variant` / `policyc.variant` — `full` or `simplified`.
- `x-policyc-compute-us` / `policyc.compute_us` — onnxruntime's run time for this call,
  measured around `InferenceSession.run`, in microseconds.
- `x-policyc-retry-count` / `policyc.retry_count` — the retry count the server saw (0
  on a first attempt).
- `x-policyc-stalled-ms` / `policyc.stalled_ms` — how long the server held the request
  (0 when it did not).
"""

from __future__ import annotations

from typing import Final

RETRY_COUNT: Final = "x-retry-count"
ENVOY_ATTEMPT_COUNT: Final = "x-envoy-attempt-count"
STALL_MS: Final = "x-policyc-stall-ms"
DECISION_ID: Final = "x-policyc-decision-id"

INSTANCE: Final = "x-policyc-instance"
VARIANT: Final = "x-policyc-variant"
COMPUTE_US: Final = "x-policyc-compute-us"
RETRY_SEEN: Final = "x-policyc-retry-count"
STALLED_MS: Final = "x-policyc-stalled-ms"

PARAM_INSTANCE: Final = "policyc.instance"
PARAM_VARIANT: Final = "policyc.variant"
PARAM_COMPUTE_US: Final = "policyc.compute_us"
PARAM_RETRY_COUNT: Final = "policyc.retry_count"
PARAM_STALLED_MS: Final = "policyc.stalled_ms"
PARAM_DECISION_ID: Final = "policyc.decision_id"

# Every response header the server sets, in the order it sets them.
RESPONSE_HEADERS: Final = (INSTANCE, VARIANT, COMPUTE_US, RETRY_SEEN, STALLED_MS)

FULL: Final = "full"
SIMPLIFIED: Final = "simplified"

# The ONNX metadata key naming a model file's variant (absent: full).
VARIANT_KEY: Final = "policyc.variant"

# The one input and output of the reference models the pool serves.
INPUT_NAME: Final = "input_ids"
OUTPUT_NAME: Final = "logits"

# The longest stall a request may ask for: a stall is a test device, never a way to park a
# server's streams for ever.
MAX_STALL_MS: Final = 60_000

# The most retries a request may say it is (`x-retry-count`; the decision service takes
# X-Retry-Count 0 to 1,000 too): a retry budget is a handful.
MAX_RETRY_COUNT: Final = 1000
