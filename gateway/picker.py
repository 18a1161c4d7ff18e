"""The endpoint picker: Envoy's `envoy.service.ext_proc.v3.ExternalProcessor`, answered by
the decision engine.

One ext_proc stream per HTTP request. On its request headers the picker decides through
the decision service's own path (`DecisionService.decide_shape`: the audit log's
fail-closed gate, the request-shape cache, the engine, metrics, the audit record), with
only instances that have an endpoint as candidates, then either forwards (`messages.forward`:
endpoints, budget, retry headers, decision id) or refuses (`messages.immediate`).

How it learns that Envoy broke a request (its per-try timeout reset the stream) and retried
it on the backup, which becomes acts for the placer and the audit log (`acts.py`):
- following Envoy's access log (`follow_access_log`, what `policyc gateway` does): the
  call's entry says how many attempts Envoy made and which host answered, a flush interval
  (tens of ms) after the answer; the pick marks a request that can break (dynamic metadata)
  so a log kept only for the picker carries just those. The pick is then the stream's only
  message: the picker answers and closes it, Envoy asks nothing about the answer;
- else (an Envoy that sends policyc no access log) in the response phase, kept open for a
  request that can break (it has a budget): the answer's headers say which host answered
  on which attempt; for the others the pick turns that phase off.

Shedding: at most `max_in_flight` requests between their pick and their end; beyond, 429
at once. A request that can break counts until its ext_proc stream ends after the response
phase or, following the access log, until its entry there (at most `OPEN_MAX_S`, should the
entry never come); one that cannot break, while it is picked (Envoy ends its ext_proc
stream with the pick's answer: nothing else is asked about it).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from policyc.audit.errors import AuditError
from policyc.compiler.bundle import Bundle, Scalar
from policyc.enforcer.rule_table import RuleTable, build_rule_table
from policyc.matcher.instance import canonical_endpoint
from policyc.server.decision import DecisionInput
from policyc.server.errors import ServiceError, Status
from policyc.server.request_shapes import RequestShapes
from policyc.server.service import DecisionService

from . import llm_pick, messages, refusal
from .access_log import AccessLogReceiver, Attempt, Call
from .acts import Acts, Break
from .bootstrap import ATTEMPT_COUNT, LB_NAMESPACE, SERVED_KEY, SUBSET_KEY, SUBSET_NAMESPACE
from .pick import Pick, plan_pick
from .pool import Pool
from .tracing import PickerTracer, Stamps, trace_context
from .llm_pick import body_kind
from .request_view import PolicyView, attributes_key, shape_key

log = logging.getLogger("policyc.gateway")

INSTANCE_HEADER = "x-policyc-instance"  # the model server names the instance that answered (modelserver/wire.py)
VARIANT_HEADER = "x-policyc-variant"
RECENT = 1024
# a pick's longest wait for its access-log entry: the route's timeout (30 s, every attempt), the
# receiver's grace for late attempts, margin; beyond, the request no longer counts as in flight
OPEN_MAX_S = 40.0
MAX_SUBSET = 4096  # a larger list is cut here: bounded work per request


@dataclass(frozen=True, slots=True)
class PickerConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: ephemeral
    max_in_flight: int = 512  # beyond: 429 (shed)
    forwarded_headers: frozenset[str] = frozenset()  # lower-case names for the model server, not the policy
    # also serve on this Unix socket (an Envoy on the same machine: a `pipe` address, cheaper than TCP loopback)
    unix_socket: str | None = None
    # request headers as Envoy hands them over (its pseudo-headers and own headers included): beyond
    # either bound, 431 with the reason (`gateway/limits.py`: Envoy's HTTP/2 codec would reset or GOAWAY)
    max_headers_count: int = 100
    max_header_bytes: int = 60 * 1024
    # the Envoy this picker serves sends each stream its request's headers and nothing else (`policyc
    # gateway`'s own bootstrap when the picker follows its access log): with no LLM routes, the method is
    # registered unary-unary (`server.py`); another Envoy may send other messages first, read by `Process`
    headers_only: bool = False


class RuleTables:
    """The bundle's request-scope budgets: the guardian's table when there is a guardian
    (lowered once per bundle by it), else lowered here once per bundle."""

    def __init__(self, guardian_table: Callable[[], RuleTable] | None, bundle: Callable[[], Bundle]) -> None:
        self._guardian_table = guardian_table
        self._bundle = bundle
        self._for: Bundle | None = None
        self._table: RuleTable | None = None

    def current(self) -> RuleTable:
        if self._guardian_table is not None:
            return self._guardian_table()
        b = self._bundle()
        if self._for is not b or self._table is None:
            self._table, self._for = build_rule_table(b), b
        return self._table


def endpoint_subset(req: ep.ProcessingRequest) -> frozenset[str] | None:
    """The Endpoint Picker Protocol's candidate subset: the `ip:port` list Envoy passes in the
    request's filter metadata (`envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`);
    None when not given (every pool endpoint is a candidate). An empty list is a subset of none."""
    if not req.HasField("metadata_context"):
        return None
    ns = req.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if ns is None or SUBSET_KEY not in ns.fields:
        return None
    v = ns.fields[SUBSET_KEY]
    kind = v.WhichOneof("kind")
    if kind == "list_value":
        items = [x.string_value for x in v.list_value.values[:MAX_SUBSET]]
    elif kind == "string_value":  # a comma-separated list, as the destination header is written
        items = v.string_value.split(",")[:MAX_SUBSET]
    else:
        items = []
    return frozenset(e for e in map(_endpoint_or_none, items) if e is not None)


@functools.lru_cache(maxsize=8192)  # a gateway names the same few endpoints again and again; parsing one costs ~8 us
def _endpoint_or_none(text: str) -> str | None:
    """`text` as the registry writes endpoints (`[::1]:80`, `10.0.0.1:80`), so the two compare;
    None for an entry that is no `ip:port` (it can name no instance: it only narrows the subset)."""
    try:
        return canonical_endpoint(text.strip())
    except ValueError:
        return None


def _value(h: Any) -> str:
    return h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value


class EndpointPicker(ep_grpc.ExternalProcessorServicer):
    def __init__(self, service: DecisionService, tables: RuleTables, acts: Acts, config: PickerConfig = PickerConfig()) -> None:
        self.service = service
        self.tables = tables
        self.acts = acts
        self.config = config
        self.pool = Pool(service.engine)
        self.shapes = RequestShapes()  # the gateway's own shapes: its inputs differ (routable only)
        # decision id -> (pick, when): picked, its request not ended (oldest first)
        self._open: dict[str, tuple[Pick, float]] = {}
        self.counts: dict[str, int] = {"forwarded": 0, "broken": 0}
        # the last picks by decision id (bounded): what `policyc gateway`, the demo and tests show
        self.recent: collections.OrderedDict[str, Pick] = collections.OrderedDict()
        self.from_access_log = False  # True once `follow_access_log`: breaks and request ends from Envoy's log
        # following that log: whether Envoy logs every call (an accounting receiver) or only those a pick
        # marks (`watch`: the breakable ones); a pick whose call is not logged never learns its end
        self._logs_every_call = False
        self._view = PolicyView(config.forwarded_headers)
        self.llm: llm_pick.LlmPicker | None = None  # `enable_llm`: LLM requests are picked on their body
        self.tracer: PickerTracer | None = None  # `--otlp-endpoint`: each pick's spans (gateway/tracing.py)
        # the placer's live in-flight counts (placer/signals/gateway_in_flight.py): begun at a forwarded pick,
        # ended by the request's access-log entry (or its ext_proc stream's end), read by the next pick
        self.in_flight_gpus = getattr(getattr(service.engine, "placer", None), "in_flight", None)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    @property
    def in_flight(self) -> int:
        return len(self._open)

    def end_in_flight(self, decision_id: str) -> None:
        """A request's answer ended where the picker does not see it (an LLM answer's attempt
        on the picked GPU, seen by the stream supervisor, `llm_stream.py`): its in-flight count
        ends, and its time joins the GPU's measured seconds per request. Safe from any thread (the
        counts take their own lock); a second end of the same decision is nothing."""
        if self.in_flight_gpus is not None:
            self.in_flight_gpus.end(decision_id)

    def first_token(self, decision_id: str, seconds: float) -> None:
        """An LLM answer's first token, `seconds` after its first attempt was sent (the stream
        supervisor's measurement): the placer learns what the contract's TTFT prediction left
        out on that GPU (`InFlightCounts.first_token`). Safe from any thread."""
        if self.in_flight_gpus is not None:
            self.in_flight_gpus.first_token(decision_id, seconds)

    def follow_access_log(self, receiver: AccessLogReceiver) -> None:
        """Learn breaks and request ends from the access log `receiver` gets from Envoy (the
        bootstrap's `breaks_from_access_log`): the pick becomes each stream's only message.
        Every Envoy this picker serves must then send that log (a pick whose entry never
        comes counts as in flight for `OPEN_MAX_S`)."""
        receiver.listeners.append(self._logged)
        self.from_access_log = True
        self._logs_every_call = receiver.records  # as the bootstrap's `log_every_call` is set (gateway/runner.py)

    async def Process(self, first: ep.ProcessingRequest,  # type: ignore[override]
                      context: grpc.aio.ServicerContext) -> None:
        """One ext_proc stream. `server.py` registers the method as unary-request: grpc hands
        over the stream's first message (its request headers) and `context.read()` reads the
        rest, the same stream as a bidirectional handler sees, without the request iterator
        and its first read (benchmarks/gateway_hop.py: `aio-unary-in` against `aio`)."""
        req: Any = first  # a ProcessingRequest, or grpc.aio.EOF once read past the last
        if self.from_access_log:
            while True:  # the request's headers are the only message asked for: answer them and end the stream
                if req is grpc.aio.EOF:
                    return
                if req.HasField("request_headers"):
                    llm_kind = body_kind(req) if self.llm is not None else None
                    if llm_kind is None:
                        stamps = self._stamps(req, context) if self.tracer is not None else None
                        resp, pick = await self._request_headers(req, stamps=stamps)
                        if stamps is not None:  # queued before the write (`_spans_after`)
                            self._spans_after(stamps)
                        await context.write(resp if pick is None or self.llm is None else self.llm.headers_answer(resp, pick))
                    else:  # an LLM request: the pick waits for its body
                        await self._llm_body(context, req, llm_kind)
                    return
                await context.write(messages.empty_for(req.WhichOneof("request") or ""))
                req = await context.read()
        picked: list[str] = []
        try:
            while True:
                if req is grpc.aio.EOF:
                    return
                kind = req.WhichOneof("request")
                if kind == "request_headers" and self.llm is not None and (llm_kind := body_kind(req)) is not None:
                    llm_decision = await self._llm_body(context, req, llm_kind)
                    if llm_decision is not None:
                        picked.append(llm_decision)
                    req = await context.read()
                    continue
                if kind == "request_headers":
                    stamps = self._stamps(req, context) if self.tracer is not None else None
                    resp, pick = await self._request_headers(req, stamps=stamps)
                    if pick is not None:
                        picked.append(pick.decision_id)
                        if self.llm is not None:
                            resp = self.llm.headers_answer(resp, pick)
                    if stamps is not None:
                        self._spans_after(stamps)
                        await context.write(resp)
                        req = await context.read()
                        continue
                elif kind == "response_headers":
                    resp = self._response_headers(req, picked)
                else:
                    resp = messages.empty_for(kind or "")
                await context.write(resp)
                req = await context.read()
        finally:
            ended = self.in_flight_gpus
            for did in picked:
                self._open.pop(did, None)
                if ended is not None:
                    ended.end(did)

    async def ProcessHeaders(self, first: ep.ProcessingRequest,
                             context: grpc.aio.ServicerContext) -> ep.ProcessingResponse | bytes:
        """One ext_proc stream when the request's headers are its only message each way (the
        picker follows the access log and reads no LLM body: `server.py` then registers the
        method unary-unary). grpc hands over the first message and sends the answer and the
        stream's status in one batch, where a streaming handler's write and its end are two
        (benchmarks/gateway_hop.py: `aio-unary` against `aio-unary-in`); on the wire it is
        the stream `Process` answers in this mode: one answer, then the stream ends."""
        if not first.HasField("request_headers"):  # never sent in this mode (only request headers are)
            return messages.empty_for(first.WhichOneof("request") or "")
        stamps = self._stamps(first, context) if self.tracer is not None else None
        resp, _ = await self._request_headers(first, stamps=stamps)
        if stamps is not None:
            self._spans_after(stamps)
        return resp

    def _spans_after(self, stamps: Stamps) -> None:
        """Queue the pick's spans for the loop's next turn: after the answer's write is under
        way (never on the pick's path), and whether or not this handler lives to see the write
        return — Envoy may end the stream as the answer lands, which cancels the handler inside
        its `await context.write` (a pick traced after the write was then never recorded: its
        spans missing from a trace now and then on a loaded machine)."""
        asyncio.get_running_loop().call_soon(self._trace_if_on, stamps)

    def _trace_if_on(self, stamps: Stamps) -> None:
        if self.tracer is not None:  # tracing may be turned off between the pick and its spans
            self._trace(stamps)

    async def _llm_body(self, context: grpc.aio.ServicerContext, headers: ep.ProcessingRequest, kind: str) -> str | None:
        """An LLM request (`llm_pick.py`): its body read to its end, then the pick answered on
        its headers and its body given back. The body-reading routes' filter is full duplex
        (`llm_routes.py`): Envoy sends the body without waiting for the headers' answer, so
        the pick costs one exchange with this process, not two (each is a wake-up of it that
        queues for a core on a loaded machine). Returns the decision id when it was forwarded."""
        assert self.llm is not None
        if headers.request_headers.end_of_stream:  # no body will come: nothing to pick on
            await context.write(llm_pick.error_response(400, f"a {kind} request needs a JSON body", "bad-body",
                                                        "invalid_request_body"))
            return None
        chunks: list[bytes] = []
        size, trailers = 0, False
        limit = self.llm.picks.max_body_bytes
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return None
            if msg.HasField("request_body"):
                size += len(msg.request_body.body)
                if size <= limit:  # past the limit nothing more is kept; refused once the client has sent it all
                    chunks.append(msg.request_body.body)  # (a refusal mid-upload resets an HTTP/2 client's stream)
                if msg.request_body.end_of_stream:
                    break
            elif msg.HasField("request_trailers"):  # the body ended with trailers (answered after the body)
                trailers = True
                break
            else:  # nothing else comes before the body's end; answered as it is, never left waiting
                await context.write(messages.empty_for(msg.WhichOneof("request") or ""))
        if size > limit:
            await context.write(llm_pick.too_large(size, limit))
            return None
        answers, pick = await self.llm.pick(headers, b"".join(chunks), kind)
        for answer in answers:
            await context.write(answer)
        if trailers and pick is not None:
            await context.write(messages.empty_for("request_trailers"))
        return pick.decision_id if pick is not None else None

    def enable_llm(self, picks: "llm_pick.LlmPicks") -> None:
        """Read the bodies of LLM requests (the bootstrap's LLM routes send them); their token
        SLO headers are the LLM picker's, not the policy's."""
        self.llm = llm_pick.LlmPicker(self, picks)
        self.config = replace(self.config, forwarded_headers=self.config.forwarded_headers | frozenset(llm_pick.SLO_HEADERS))

    def _stamps(self, req: ep.ProcessingRequest, context: grpc.aio.ServicerContext) -> Stamps:
        """A traced pick's stamps, with the trace context Envoy (or the client) sent."""
        parent, state = trace_context(context.invocation_metadata(), req.request_headers.headers.headers)
        return Stamps(traceparent=parent, tracestate=state)

    def _trace(self, stamps: Stamps) -> None:
        """The pick's spans, queued for the exporter (`_spans_after`: never on the pick's own path)."""
        assert self.tracer is not None
        try:
            self.tracer.record(stamps)
        except Exception:  # noqa: BLE001 - a tracing failure never touches the request
            log.exception("picker: the spans of decision %s", stamps.decision_id)

    async def _request_headers(self, req: ep.ProcessingRequest,
                               attributes: Mapping[str, Scalar] | None = None,
                               stamps: Stamps | None = None) -> tuple[ep.ProcessingResponse | bytes, Pick | None]:
        """The pick, in one coroutine (the hot path: one frame, no await unless a new shape
        needs its feasibility answer or the audit log is in sync mode). `attributes`: typed
        request variables besides the headers (an LLM request's body, `llm_pick.py`).
        `stamps`: a traced pick's times, filled in here (`tracing.py`)."""
        t0 = time.perf_counter()
        if stamps is not None:
            stamps.start = stamps.parsed = stamps.decided = stamps.end = t0
        try:
            open_ = self._open
            if open_ and self.from_access_log:
                self._expire(t0)
            config = self.config
            if len(open_) >= config.max_in_flight:
                self._count("shed")
                return messages.immediate(refusal.shed(self.in_flight, config.max_in_flight)), None
            header_map = req.request_headers.headers
            if len(header_map.headers) > config.max_headers_count or header_map.ByteSize() > config.max_header_bytes:
                self._count("headers-too-large")
                return messages.immediate(refusal.headers_too_large(len(header_map.headers), header_map.ByteSize(),
                                                                    config.max_headers_count, config.max_header_bytes)), None
            view = self._view
            if view.forwarded is not config.forwarded_headers:  # the configuration changed
                view = self._view = PolicyView(config.forwarded_headers)
            policy = view.of(req.request_headers.headers.headers)
            service, shapes = self.service, self.shapes
            subset = endpoint_subset(req)
            try:
                key = shape_key(policy) if attributes is None else shape_key(policy) + attributes_key(attributes)
                if subset is not None:
                    key = key + b"\x00subset\x00" + ",".join(sorted(subset)).encode()
                if stamps is not None:
                    stamps.parsed = time.perf_counter()
                make_input = lambda: DecisionInput(policy, attributes or {}, routable_only=True,  # noqa: E731
                                                   endpoint_subset=subset)
                prepared = None
                if shapes.get(service.engine.state, key) is None:  # a new shape: Z3 off the loop
                    prepared = await service.prepare_new_shape(shapes, key, make_input)
                d, _, durable = service.decide_shape(shapes, key, make_input, t0, prepared)
                if durable is not None:
                    await durable  # sync audit: forward only once the decision's record is on disk
                if stamps is not None:
                    stamps.decided = stamps.end = time.perf_counter()
                    stamps.decision_id, stamps.timing = d.decision_id, d.timing
            except ServiceError as e:
                r = refusal.from_error(e)
                self._count(r.cause)
                return messages.immediate(r), None
            except AuditError as e:
                self._count("audit")
                return messages.immediate(refusal.from_error(ServiceError(Status.UNAVAILABLE, str(e)))), None
            if not d.admitted:
                r = refusal.from_rejection(d) if subset is None else refusal.outside_subset(d)
                self._count(r.cause)
                return messages.immediate(r), None
            published = self.pool.published
            if not d.endpoint or (published is not None and d.endpoint not in published) or \
                    (subset is not None and d.endpoint not in subset):
                self._count("no-instance")
                return messages.immediate(refusal.no_endpoint(d, published is not None and bool(d.endpoint))), None
            pick = plan_pick(d, self.tables.current(), self.pool, time.perf_counter() - t0, subset)
            breakable = pick.per_try_timeout_ms is not None
            from_log = self.from_access_log
            # counted in flight only when its end will be seen: its access-log entry (Envoy logs the calls a pick
            # marks, the breakable ones, or every call) or, not following the log, its ext_proc stream's end; a
            # count that never ends would stand on its GPU until `InFlightCounts.max_age_s` (60 s of traffic).
            # An LLM pick (`attributes`: its body's) is counted whatever the log carries: the stream supervisor
            # sees its answer end (`end_in_flight`, from `llm_stream.py`)
            if self.in_flight_gpus is not None and (breakable or not from_log or self._logs_every_call
                                                    or attributes is not None):
                self.in_flight_gpus.begin(pick.decision_id, pick.gpu_key, d.plan.contract_ttft_s if d.plan else None)
            if breakable or not from_log:  # following the log: only a breakable request gets an entry that ends it
                open_[pick.decision_id] = (pick, t0)
            self._count("forwarded")
            recent = self.recent
            recent[pick.decision_id] = pick
            if len(recent) > RECENT:
                recent.popitem(last=False)
            if stamps is not None:
                stamps.end = time.perf_counter()
            return messages.forward_bytes(pick, breakable and not from_log, breakable and from_log), pick
        except Exception as e:  # noqa: BLE001 - the boundary: a bug refuses this request, never forwards it
            log.exception("picker failed")
            self._count("internal")
            return messages.immediate(refusal.internal(f"{type(e).__name__}: {e}")), None

    def _expire(self, now: float) -> None:
        """Forget the picks whose access-log entry has not come in `OPEN_MAX_S` (oldest first)."""
        open_ = self._open
        while open_:
            did, (_, since) = next(iter(open_.items()))
            if now - since < OPEN_MAX_S:
                return
            del open_[did]
            self._count("unlogged")

    def _logged(self, call: Call, attempts: list[Attempt]) -> None:
        """The access log's entry for one call (every attempt of it, as Envoy measured them):
        the request has ended; if Envoy broke it and retried, record the acts."""
        if self.in_flight_gpus is not None:
            self.in_flight_gpus.end(call.decision_id)
        opened = self._open.pop(call.decision_id, None)
        if opened is None:  # not picked here (another replica's), or forgotten after OPEN_MAX_S
            return
        pick, _ = opened
        if pick.per_try_timeout_ms is None:  # no budget: Envoy makes a single attempt
            return
        try:
            # the answering attempt (a reset one has no HTTP status; Envoy may log the broken ones only)
            answered = next((a for a in attempts if a.status), None)
            served = answered.host if answered is not None else call.upstream_host
            if call.attempts < 2 and (not served or served == pick.endpoint):
                return
            broken = [a for a in attempts if a is not answered]
            budget_s = pick.per_try_timeout_ms / 1e3
            # the per-try timeout: Envoy's flag on the attempt, or the attempt lasted its budget
            at_budget = any("upstream_request_timeout" in a.flags or (a.duration is not None and a.duration >= budget_s * 0.98)
                            for a in broken)
            # the break: the broken attempt's end (it started within the pick of the call's start); not
            # logged, the call's end (a lower bound of the lag)
            ends = [call.start + a.duration for a in broken if a.duration is not None and a.status == 0]
            lag = time.time() - (max(ends) if ends else call.start + (call.duration or 0.0))
            b = Break(pick.decision_id, pick.breaker.name if pick.breaker else "", pick.endpoint, served,
                      (answered.instance if answered is not None else call.instance) or "", max(call.attempts, len(attempts)),
                      call.first_byte if call.first_byte is not None else (call.duration or 0.0), at_budget, max(lag, 0.0))
            self.acts.broken(pick, b, call.variant or "")
            self._count("broken")
        except Exception:  # noqa: BLE001 - the log goes on; what the picker failed to record is logged
            log.exception("picker: access-log entry of decision %s", pick.decision_id)

    def _response_headers(self, req: ep.ProcessingRequest, picked: list[str]) -> ep.ProcessingResponse:
        opened = self._open.get(picked[-1]) if picked else None
        if opened is None:  # the request was refused: nothing was sent upstream
            return messages.CONTINUE_RESPONSE_HEADERS
        pick, started = opened
        try:
            headers = {h.key: _value(h) for h in req.response_headers.headers.headers}
            attempt_text = headers.get(ATTEMPT_COUNT, "1")
            attempt = int(attempt_text) if attempt_text.isdigit() else 1
            served = ""
            lb = req.metadata_context.filter_metadata.get(LB_NAMESPACE)
            if lb is not None and SERVED_KEY in lb.fields:
                served = lb.fields[SERVED_KEY].string_value
            if attempt >= 2 or (served and served != pick.endpoint):
                elapsed = time.perf_counter() - started
                budget = pick.per_try_timeout_ms
                b = Break(pick.decision_id, pick.breaker.name if pick.breaker else "", pick.endpoint, served,
                          headers.get(INSTANCE_HEADER, ""), attempt, elapsed,
                          budget is not None and elapsed * 1e3 >= budget)
                self.acts.broken(pick, b, headers.get(VARIANT_HEADER, ""))
                self._count("broken")
        except Exception:  # noqa: BLE001 - the answer goes on; what the picker failed to record is logged
            log.exception("picker: response phase of decision %s", pick.decision_id)
        return messages.CONTINUE_RESPONSE_HEADERS
