"""Each LLM answer as it passes the gateway, attempt by attempt: its first token held to
its TTFT budget, its stream to its TPOT budget, its tokens and times measured.

Envoy runs an `ext_proc` filter among the pool's *upstream* filters (`supervised_clusters`),
pointed at this supervisor (its own gRPC server, on the picker's event loop: `SupervisorServer`). An upstream
filter sees one attempt, and it sees the answer before the router does:

- **Before the first token.** The supervisor holds the answer's headers until the first
  body chunk arrives. Until the router has the headers the attempt has not "started the
  downstream response", so Envoy's per-try timeout still applies: the picker set it to the
  request's TTFT budget (`llm_pick`), and at that budget Envoy resets this attempt's stream
  and retries once on the backup (`X-Retry-Count: 1`), as for unary calls. The client sees
  one answer. (vLLM sends its headers before the first token; without the hold a TTFT
  budget could never be enforced on a stream.)
- **After tokens were sent.** The answer has begun; it cannot be retried. A gap between
  chunks longer than the TPOT budget ends the stream: the supervisor sends a last SSE event
  with an OpenAI-style `error` object and `data: [DONE]`, then has Envoy reset the stream
  (an immediate response once the answer has begun is a reset: the upstream request is
  reset, so the model server stops generating; the client has the error event and `[DONE]`,
  then its transfer ends without the last chunk), and records a `cancel_stream` act and an
  anomaly report.
- **Evidence.** Every answer (stream or not) is measured here: the time to the first
  chunk and the mean gap after it (TTFT, TPOT, measured at the gateway), the prompt and
  completion tokens from the answer's `usage` (a stream's last event; the picker asks for
  it) or, without one, the events counted, the bytes. One `accounting` record per attempt
  that answered, with the contract's estimate beside the measured figures, marked estimated.
  The record is submitted *before* the answer's last message is passed back to Envoy: once
  Envoy has it, it finishes the attempt and resets this gRPC stream, and the reset may
  cancel this handler before a write that already went out returns (seen: 3 streams in 60
  without their record). An attempt reset after its first chunk (the client left) is
  recorded with what it sent, marked as cut.

A client that disconnects resets the downstream stream; Envoy resets the upstream one and
the model server stops (its own abort on disconnect).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import grpc
import msgspec
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from policyc.audit.records import ActionRecord, Figure, LlmFigures, Resources, Source
from policyc.compiler import meaning
from policyc.enforcer.rule_table import ELAPSED

from .acts import ActionLog, AnomalySink
from .bootstrap import ATTEMPT_COUNT, DECISION_HEADER
from .llm_body import LlmRequest
from .llm_pick import LlmPicks
from .messages import empty_for

log = logging.getLogger("policyc.gateway")
SUPERVISOR_CLUSTER = "policyc_llm_supervisor"
MAX_USAGE_BYTES = 1 << 20  # of a non-streamed answer kept to read its usage
KEEP = 4096


@dataclass
class Evidence:
    """One answered attempt, as the gateway measured it."""

    decision_id: str
    attempt: int
    model: str
    stream: bool
    started: float  # perf_counter at the attempt's request headers
    first: float | None = None  # at the first body chunk
    last: float | None = None
    chunks: int = 0
    events: int = 0  # SSE events carrying choices (a stream's tokens, as sent)
    bytes: int = 0
    usage: dict[str, Any] | None = None
    ended_by_tpot: bool = False
    reset: bool = False  # its stream was reset (Envoy, the client) after its first chunk: the answer was cut
    recorded: bool = False  # its accounting record submitted (once)
    gaps: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        return self.first - self.started if self.first is not None else None

    @property
    def tpot_s(self) -> float | None:
        return sum(self.gaps) / len(self.gaps) if self.gaps else None

    def tokens(self) -> tuple[int | None, int | None, str]:
        """(prompt, completion, how): from `usage` when the answer had one, else the stream's events."""
        if self.usage is not None:
            p, c = self.usage.get("prompt_tokens"), self.usage.get("completion_tokens")
            return (p if isinstance(p, int) else None), (c if isinstance(c, int) else None), "usage"
        return None, (self.events if self.stream else None), "events counted"


def _headers(h: Any) -> dict[str, str]:
    return {x.key.lower(): (x.raw_value.decode("utf-8", "replace") if x.raw_value else x.value) for x in h.headers.headers}


def _sse_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete `data:` payloads in `buf`, and the incomplete rest."""
    out: list[bytes] = []
    while True:
        i = buf.find(b"\n\n")
        if i < 0:
            return out, buf
        event, buf = buf[:i], buf[i + 2:]
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                out.append(line[5:].strip())


def error_event(message: str, code: str) -> bytes:
    """The last event of a stream the gateway ended: the OpenAI clients raise it as an APIError."""
    err = msgspec.json.encode({"error": {"message": message, "type": "server_error", "param": None, "code": code}})
    return b"data: " + err + b"\n\ndata: [DONE]\n\n"


def _body(chunk: bytes, end: bool) -> ep.ProcessingResponse:
    r = ep.ProcessingResponse()
    sr = r.response_body.response.body_mutation.streamed_response
    sr.body = chunk
    sr.end_of_stream = end
    return r


_SKIP = ep.ProcessingResponse(request_headers=ep.HeadersResponse())
_SKIP.mode_override.response_header_mode = ProcessingMode.SKIP
_SKIP.mode_override.response_body_mode = ProcessingMode.NONE
_SKIP.mode_override.response_trailer_mode = ProcessingMode.SKIP
_CONTINUE_REQUEST = ep.ProcessingResponse(request_headers=ep.HeadersResponse())
_CONTINUE_RESPONSE = ep.ProcessingResponse(response_headers=ep.HeadersResponse())
_CONTINUE_TRAILERS = ep.ProcessingResponse(response_trailers=ep.TrailersResponse())
_RESET = ep.ProcessingResponse()
_RESET.immediate_response.status.code = 504  # type: ignore[assignment]  # the answer has begun: Envoy resets the stream
_RESET.immediate_response.details = "policyc_tpot_exceeded"


class StreamSupervisor(ep_grpc.ExternalProcessorServicer):
    def __init__(self, picks: LlmPicks, bundle: Callable[[], Any], action_log: ActionLog | None = None,
                 anomalies: AnomalySink | None = None, gpu_of: Callable[[str], str | None] = lambda _: None,
                 retry_headers_of: Callable[[str], tuple[tuple[str, str], ...]] = lambda _: (),
                 gpu_model_of: Callable[[str], str | None] = lambda _: None,
                 ended: Callable[[str], object] = lambda _: None,
                 first_token: Callable[[str, float], object] = lambda _, __: None) -> None:
        self.picks = picks
        self.bundle = bundle  # the current bundle
        self.log = action_log
        self.anomalies = anomalies  # the placer: a stalled stream's GPU loses health on its next tick
        self.gpu_of = gpu_of  # decision id -> the GPU key of the instance picked for it
        # decision id -> the headers its retry carries (`X-Retry-Count: 1`, the redirect's), set here on attempts
        # after the first: this filter sees each attempt's own headers, whatever the filters before it removed
        self.retry_headers_of = retry_headers_of
        self.gpu_model_of = gpu_model_of  # decision id -> the GPU class of the instance picked (the estimate's rate)
        # called with the decision id when an attempt's answer ends (done, cut or reset): the picker's count of
        # its requests in flight on the picked GPU ends there (placer/signals/gateway_in_flight.py). An LLM call
        # has no budget of the picker's, so no access-log entry ends it: this is where its end is seen
        self.ended = ended
        # called with the decision id and the seconds to its first chunk, on a request's first attempt: the picker
        # learns what the contract's TTFT prediction leaves out on the picked GPU (placer/signals/predicted_ttft.py)
        self.first_token = first_token
        self.evidence: dict[str, list[Evidence]] = {}  # decision id -> its answered attempts (bounded)
        self.records: list[ActionRecord] = []
        self.counts: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def tpot_budget(self, req: LlmRequest) -> float | None:
        if req.tpot_s is not None:
            return req.tpot_s
        c = self.bundle().contract(req.model)
        return c.llm.tpot if c is not None and c.llm is not None else None

    async def Process(self, request_iterator: AsyncIterator[ep.ProcessingRequest],  # type: ignore[override]
                      context: grpc.aio.ServicerContext) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if not first.HasField("request_headers"):
            return
        h = _headers(first.request_headers)
        did = h.get(DECISION_HEADER, "")
        req = self.picks.recent.get(did)
        if req is None:  # not an LLM request the picker read: nothing to hold or measure
            await context.write(_SKIP)
            await self._pass(context)
            return
        attempt = int(h.get(ATTEMPT_COUNT, "1")) if h.get(ATTEMPT_COUNT, "1").isdigit() else 1
        ev = Evidence(did, attempt, req.model, req.stream, time.perf_counter())
        retry = self.retry_headers_of(did) if attempt >= 2 else ()
        if retry:
            answer = ep.ProcessingResponse(request_headers=ep.HeadersResponse())
            for k, v in retry:
                answer.request_headers.response.header_mutation.set_headers.add(
                    header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
            await context.write(answer)
        else:
            await context.write(_CONTINUE_REQUEST)
        try:
            await self._answer(context, req, ev)
        except asyncio.CancelledError:  # Envoy reset this attempt (its per-try timeout, the client left)
            self._count("reset")
            if ev.first is not None and not ev.recorded:  # it had begun to answer: what it sent is evidence
                ev.reset = True
                self._record(req, ev)
            raise
        finally:
            self.ended(did)

    @staticmethod
    async def _pass(context: grpc.aio.ServicerContext) -> None:
        """Whatever Envoy still sends after the skip, passed back unchanged until the answer ends: the
        stream closed at once after it left Envoy passing the answer's headers without its body now and
        then (an empty 200 to GET /v1/models, 2 in 10)."""
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            kind = msg.WhichOneof("request")
            if kind == "response_headers":
                await context.write(_CONTINUE_RESPONSE)
                if msg.response_headers.end_of_stream:
                    return
            elif kind == "response_body":
                await context.write(_body(msg.response_body.body, msg.response_body.end_of_stream))
                if msg.response_body.end_of_stream:
                    return
            elif kind == "response_trailers":
                await context.write(_CONTINUE_TRAILERS)
                return
            else:
                await context.write(empty_for(kind or ""))

    async def _answer(self, context: grpc.aio.ServicerContext, req: LlmRequest, ev: Evidence) -> None:
        headers_pending = False
        tpot = self.tpot_budget(req)
        pending = b""
        kept = bytearray()
        while True:
            timeout = tpot if (ev.first is not None and req.stream and tpot is not None) else None
            try:
                if timeout is None:
                    msg = await context.read()
                else:  # a deadline on this read (not `wait_for`, which wraps every chunk's read in a task of its own)
                    async with asyncio.timeout(timeout):
                        msg = await context.read()
            except TimeoutError:  # a gap over the TPOT budget after tokens were sent: end the stream
                assert tpot is not None  # (a read waits with a timeout only then)
                ev.ended_by_tpot = True
                gap = time.perf_counter() - (ev.last or ev.started)
                self._stalled(req, ev, tpot, gap)  # recorded before the writes: a reset may cancel this handler in them
                self._record(req, ev)
                await context.write(_body(error_event(
                    f"the stream stalled: no token for {gap * 1e3:.0f} ms, over its time-per-output-token budget of "
                    f"{tpot * 1e3:.0f} ms (tpot); ended by the gateway after {ev.events} tokens", "tpot_exceeded"), False))
                # then reset the stream: the only way an upstream filter makes Envoy reset the upstream request
                # (ending the body cleanly would leave the model server generating into a finished answer)
                await context.write(_RESET)
                return
            if msg is grpc.aio.EOF:
                return
            kind = msg.WhichOneof("request")
            if kind == "response_headers":
                if msg.response_headers.end_of_stream:
                    await context.write(_CONTINUE_RESPONSE)
                    return
                headers_pending = True  # held until the first chunk: until then the per-try timeout applies
                continue
            if kind == "response_body":
                now = time.perf_counter()
                chunk = msg.response_body.body
                end = msg.response_body.end_of_stream
                if headers_pending:
                    await context.write(_CONTINUE_RESPONSE)
                    headers_pending = False
                if chunk:
                    if ev.first is None:
                        ev.first = now
                        if ev.attempt == 1:
                            try:
                                self.first_token(ev.decision_id, now - ev.started)
                            except Exception:  # noqa: BLE001 - a measurement's bug never fails the answer
                                self._count("first-token-lost")
                                log.exception("the first token of decision %s not learned from", ev.decision_id)
                    elif ev.last is not None:
                        ev.gaps.append(now - ev.last)
                    ev.last = now
                    ev.chunks += 1
                    ev.bytes += len(chunk)
                    if req.stream:
                        events, pending = _sse_events(pending + chunk)
                        for data in events:
                            self._event(data, ev)
                    elif len(kept) + len(chunk) <= MAX_USAGE_BYTES:
                        kept += chunk
                if end:  # recorded before the last write: Envoy resets this stream as soon as it has it
                    if not req.stream:
                        self._usage_of(bytes(kept), ev)
                    self._record(req, ev)
                await context.write(_body(chunk, end))
                if end:
                    return
                continue
            if kind == "response_trailers":
                self._record(req, ev)  # before the writes, as above
                if headers_pending:
                    await context.write(_CONTINUE_RESPONSE)
                await context.write(_CONTINUE_TRAILERS)
                return
            await context.write(empty_for(kind or ""))

    def _event(self, data: bytes, ev: Evidence) -> None:
        """One SSE payload: a token chunk is counted from its bytes (no JSON parse per token);
        only an event carrying a `usage` object is parsed."""
        if data == b"[DONE]" or not data.startswith(b"{"):
            return
        if b'"usage":{' not in data and b'"usage": {' not in data:
            if b'"choices":[{' in data or b'"choices": [{' in data:
                ev.events += 1
            return
        try:
            obj = msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            return
        if not isinstance(obj, dict):
            return
        if obj.get("choices"):
            ev.events += 1
        usage = obj.get("usage")
        if isinstance(usage, dict):
            ev.usage = usage

    def _usage_of(self, body: bytes, ev: Evidence) -> None:
        try:
            obj = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):
            return
        if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
            ev.usage = obj["usage"]

    def _stalled(self, req: LlmRequest, ev: Evidence, tpot: float, gap: float) -> None:
        self._count("tpot-ended")
        self._act("cancel_stream", f"stream of request {ev.decision_id}",
                  f"ended after {ev.events} tokens: no token for {gap * 1e3:.0f} ms, over the TPOT budget of "
                  f"{tpot * 1e3:.0f} ms; a final SSE error event sent (code tpot_exceeded), the upstream stream reset "
                  "(the answer had begun: no retry)", ev.decision_id)
        gpu = self.gpu_of(ev.decision_id)
        if self.anomalies is not None and gpu:
            try:
                self.anomalies.report_anomaly(gpu, ELAPSED, gap)
            except Exception:  # noqa: BLE001 - said in the act below; the stream is already ended
                log.exception("llm stream: anomaly report for %s", ev.decision_id)
                gpu = None
        self._act("report_anomaly", gpu or f"model {req.model}",
                  f"{ELAPSED}={gap:.4f}s between tokens of decision {ev.decision_id} (TPOT budget {tpot:.4f}s)"
                  + ("" if self.anomalies is not None and gpu else ": no placer or GPU to report to"), ev.decision_id,
                  "done" if self.anomalies is not None and gpu else "skipped")

    def _act(self, kind: str, target: str, detail: str, decision_id: str, outcome: str = "done",
             resources: Resources | None = None, llm: LlmFigures | None = None) -> None:
        r = ActionRecord(time=time.time(), kind=kind, target=target, outcome=outcome, dry_run=False,  # type: ignore[arg-type]
                         decision_id=decision_id, detail=f"{detail} (source: gateway)", resources=resources, llm=llm)
        self.records.append(r)
        if len(self.records) > KEEP:
            del self.records[: len(self.records) - KEEP]
        if self.log is not None:
            try:
                self.log.submit_action(r)
            except Exception as e:  # noqa: BLE001 - counted and said; the answer is on its way
                self._count("audit-lost")
                log.error("audit: LLM evidence for decision %s not recorded: %s", decision_id, e)

    def figures(self, req: LlmRequest, ev: Evidence) -> LlmFigures:
        """The measured figures of `ev`, the contract's estimate beside them."""
        prompt, completion, how = ev.tokens()
        m = Source.MEASURED
        out: dict[str, Figure | None] = {
            "prompt_tokens": Figure(value=prompt, source=m, method=f"gateway: the answer's {how}") if prompt is not None
            else Figure(value=req.prompt.tokens, source=Source.MEASURED if req.prompt.counted else Source.ESTIMATED,
                        method=f"gateway: {req.prompt.how}"),
            "completion_tokens": Figure(value=completion, source=m, method=f"gateway: the answer's {how}")
            if completion is not None else None,
            "ttft_seconds": Figure(value=ev.ttft_s, source=m, method="gateway: attempt start to first body chunk")
            if ev.ttft_s is not None else None,
            "tpot_seconds": Figure(value=ev.tpot_s, source=m, method="gateway: mean gap between body chunks after the first")
            if ev.tpot_s is not None else None,
        }
        c = self.bundle().contract(req.model)
        if c is not None and c.llm is not None:
            out["ttft_budget_seconds"] = Figure(value=c.llm.ttft, source=Source.ESTIMATED, method="contract: llm.ttft") \
                if c.llm.ttft is not None else None
            out["tpot_budget_seconds"] = Figure(value=c.llm.tpot, source=Source.ESTIMATED, method="contract: llm.tpot") \
                if c.llm.tpot is not None else None
            output = completion if completion is not None else (req.max_tokens or 0)
            flops = meaning.llm_cost(c.llm, req.prompt.tokens, output, 1.0).flops
            out["flops"] = Figure(value=flops, source=Source.ESTIMATED,
                                  method="contract: llm.prefill x prompt tokens + llm.decode x completion tokens")
            gpu_name = self.gpu_model_of(ev.decision_id)
            gpu = self.bundle().gpu(gpu_name) if gpu_name else None
            rate = meaning.compute_rate(c.compute, gpu) if gpu is not None else None
            if rate:
                cost = meaning.llm_cost(c.llm, req.prompt.tokens, output, rate)
                how = f"contract: llm FLOPs at {gpu_name}'s peak x the contract's efficiency, a whole GPU"
                out["ttft_estimated_seconds"] = Figure(value=cost.ttft_s, source=Source.ESTIMATED, method=how)
                out["total_estimated_seconds"] = Figure(value=cost.total_s, source=Source.ESTIMATED, method=how)
        return LlmFigures(**out)  # type: ignore[arg-type]

    def _record(self, req: LlmRequest, ev: Evidence) -> None:
        if ev.recorded:
            return
        ev.recorded = True
        kept = self.evidence.setdefault(ev.decision_id, [])
        kept.append(ev)
        if len(self.evidence) > KEEP:
            self.evidence.pop(next(iter(self.evidence)))
        try:
            figures = self.figures(req, ev)
        except Exception:  # noqa: BLE001 - the answer went through; what could not be recorded is logged
            log.exception("llm stream: figures of %s", ev.decision_id)
            return
        self._count("answered")
        self._act("accounting", f"LLM call {ev.decision_id} attempt {ev.attempt}",
                  f"{req.model}: {ev.bytes} bytes in {ev.chunks} chunks"
                  f"{', ended at its TPOT budget' if ev.ended_by_tpot else ''}"
                  f"{', cut: its stream was reset before the answer ended' if ev.reset else ''}", ev.decision_id,
                  resources=Resources(network_bytes=Figure(value=ev.bytes, source=Source.MEASURED,
                                                           method="gateway: answer body bytes")), llm=figures)


class SupervisorServer:
    """The supervisor's own gRPC server (Envoy's upstream ext_proc filter calls it).

    The gateway runs it on the decision server's event loop, beside the picker (`llm_side.py`),
    not on a loop of its own thread: two loops' threads hand the GIL to each other on every
    message, and measured that way it was slower — 2 real vLLM at 8 req/s, the router on a core of its own, TTFT p90 117 / 112 ms
    on one loop against 128 / 122 on two (the router's threads' wait for a core 5.2 s against
    6.6–7.2); on shared cores 98.7 / 96.8 % attained against 96.2 / 93.6; with fast emulators,
    `benchmarks/router_ttft.py`, lower added TTFT in 5 of 6 paired runs (benchmarks/RESULTS.md)."""

    def __init__(self, supervisor: StreamSupervisor, host: str = "127.0.0.1") -> None:
        self.supervisor = supervisor
        self.host = host
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        ep_grpc.add_ExternalProcessorServicer_to_server(self.supervisor, server)
        port = server.add_insecure_port(f"{self.host}:0")
        await server.start()
        self._server = server
        return port

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
