"""Real traffic through the gateway: Open Inference Protocol calls over HTTP/2 to Envoy,
which asks policyc's picker where each goes (or whether it goes at all) and sends it to a
real model server. What the client sees is printed: the answer (the instance that
computed it, the variant, onnxruntime's time) or the gateway's refusal and its reason."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import grpc

from policyc.gateway.messages import CAUSE_HEADER
from policyc.modelserver.client import Answer, OipClient, rest_body, token_ids

from .narration import Narrator

# The Endpoint Picker Protocol's statuses, as an HTTP caller sees them (a gRPC caller gets
# the gRPC status the picker sets with the same reason).
HTTP_OF = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.PERMISSION_DENIED: 403,
           grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.RESOURCE_EXHAUSTED: 429}


@dataclass(frozen=True, slots=True)
class Outcome:
    answer: Answer | None
    code: grpc.StatusCode
    reason: str
    elapsed_s: float
    cause: str = ""  # the gateway's refusal cause (`x-policyc-refusal`): bad-header, rule, no-instance, …


def shown(headers: dict[str, str]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in headers.items())


class Traffic:
    """One client (one HTTP/2 connection to Envoy) and the lines it prints."""

    def __init__(self, say: Narrator, listen: str) -> None:
        self.say = say
        self.listen = listen
        self.client = OipClient(listen)
        self._seed = 0

    def close(self) -> None:
        self.client.close()

    def send(self, title: str, headers: dict[str, str], *, extra: dict[str, str] | None = None,
             timeout: float = 10.0) -> Outcome:
        """One ModelInfer through Envoy for the model `X-Model` names (fraud-scorer by default)."""
        self.say.say()
        self.say.say(f"▶ {title}  [{shown(headers)}{'; ' + shown(extra) if extra else ''}]")
        model = headers.get("X-Model", "fraud-scorer")
        metadata = [(k.lower(), v) for k, v in {**headers, **(extra or {})}.items()]
        self._seed += 1
        t = time.monotonic()
        try:
            a = self.client.infer(model, token_ids(16, seed=self._seed), metadata=metadata, timeout=timeout)
        except grpc.RpcError as e:
            trailers = dict(e.trailing_metadata() or ())  # type: ignore[attr-defined]
            o = Outcome(None, e.code(), e.details() or "", time.monotonic() - t, str(trailers.get(CAUSE_HEADER, "")))
            http = HTTP_OF.get(o.code)
            note = ", ".join(x for x in (f"HTTP {http}" if http else "", o.cause) if x)
            self.say.say(f"  {o.code.name}{f' ({note})' if note else ''}  {o.reason}")
            return o
        o = Outcome(a, grpc.StatusCode.OK, "", time.monotonic() - t)
        self.say.say(f"  OK  {model} answered by `{a.instance}` ({a.variant} variant, onnxruntime {a.compute_us} µs, "
                     f"{o.elapsed_s * 1e3:.1f} ms end to end{', retry ' + str(a.retry_count) if a.retry_count else ''})"
                     f" · decision {a.decision_id or '?'}")
        return o

    def send_http(self, title: str, headers: dict[str, str]) -> tuple[int, str]:
        """The same request as an HTTP/1.1 caller makes it (v2 REST path through Envoy):
        the status and reason are the gateway's, before any model server is reached."""
        self.say.say()
        self.say.say(f"▶ {title}  [HTTP/1.1 POST /v2/models/fraud-scorer/infer; {shown(headers)}]")
        req = urllib.request.Request(f"http://{self.listen}/v2/models/fraud-scorer/infer", data=rest_body(token_ids(4)),
                                     headers={"content-type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback
                status, body = r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode(errors="replace")
        self.say.say(f"  HTTP {status}  {body.strip()[:300]}")
        return status, body
