"""The gRPC servicer: authentication, input limits and deadlines, then the engine.

Runs on grpc.aio; the engine's work is CPU-bound and short (microseconds to a few
milliseconds) so it runs inline on the event loop; a bundle reload, which rebuilds the
index, runs in a worker thread so serving continues on the old state until the swap.
Every refusal is a precise status with the problem in the message and, one per line, in
the `policyc-problem` trailing metadata (`policyc-field` names a field when there is one).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable

import grpc

from policyc.placer.topology import Topology
from policyc.audit.errors import AuditError
from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle
from policyc.matcher import Instance
from policyc.compiler.diagnostic import error
from policyc.solver.feasibility import Pending

from . import convert
from .audit_bridge import AuditBridge
from .auth import Permission, Tokens
from .bundle_verifier import BundleVerifier
from .request_decode import Undecodable
from .decision import Decision, DecisionInput
from .endpoint_rules import EndpointRules
from .engine import DecisionEngine
from .errors import ServiceError, Status
from .decide_batch import BadBatch, join_decisions, split_requests
from .feasibility_series import FeasibilitySeries
from .metrics import Metrics
from .prepared import Prepared
from .request_input import to_request
from .proto import pb, pb_grpc
from .request_shapes import RequestShapes, ShapeEntry
from .state import PolicyState
from .rich_status import default_code, refusal_trailers
from .rpc_metrics import code_name, counts_itself
from .host_facts import hosts_msg
from .register_batch import register_instances
from .registration import (admissible, check_against_bundle, check_counted_cost, check_facts, contract_from_json,
                           contract_from_onnx, request_id_of)

CODES = {s: getattr(grpc.StatusCode, s.value) for s in Status}
log = logging.getLogger("policyc.server")


def _ascii(text: str) -> str:
    """Metadata values must be printable ASCII; keep the message readable anyway (a NUL or
    a line break echoed from the input would make the whole status INTERNAL)."""
    text = text.replace("…", "...").replace("→", "->").encode("ascii", "replace").decode()
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def _no_tracebacks(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A bug inside an RPC becomes INTERNAL with a one-line reason (logged in full here),
    never a Python traceback on the wire; the server keeps serving."""

    @functools.wraps(method)
    async def run(self: "DecisionService", request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):  # bytes that are not the message (see request_decode.py)
            self.metrics.errors.labels(method.__name__, "INVALID_ARGUMENT").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _ascii(request.describe()))
        try:
            return await method(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as e:  # noqa: BLE001 - the boundary where bugs are contained
            await _internal(self, context, method.__name__, e)

    return run


async def _internal(service: "DecisionService", context: grpc.aio.ServicerContext, method: str, e: Exception) -> None:
    """A bug in `method`: logged in full, counted, answered INTERNAL with one line (abort raises)."""
    log.exception("%s failed", method)
    service.metrics.errors.labels(method, "INTERNAL").inc()
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(e).__name__}: {e}")


class DecisionService(pb_grpc.DecisionsServicer):
    def __init__(self, engine: DecisionEngine, metrics: Metrics, tokens: Tokens, *, audit: AuditBridge | None = None,
                 max_decide_bytes: int = 64 * 1024, load_bundle: Callable[[str], Bundle] | None = None,
                 verifier: BundleVerifier | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.tokens = tokens
        self.audit = audit
        self.max_decide_bytes = max_decide_bytes
        self.verifier = verifier or BundleVerifier()  # one trust policy for start, ReloadBundle and SIGHUP
        self._load_bundle = load_bundle or self.verifier.load_path
        self._reload_lock = asyncio.Lock()
        self.shapes = RequestShapes()
        self.feasibility_series = FeasibilitySeries(lambda: self.engine.state.feasibility)
        self.topology: Callable[[], Topology | None] = lambda: None  # what registration checks facts against (app sets it)
        self.endpoints = EndpointRules()  # where an endpoint may point (the app and the gateway reserve their ports)
        metrics.registry.register(self.feasibility_series)

    # ------------------------------------------------------------------ common checks
    def _admit(self, context: grpc.aio.ServicerContext, permission: Permission, size: int | None = None) -> None:
        """Deadline and size limits (roles were checked by `auth.GuardedHandler` before the
        method ran; `permission` names what the method needs, for readers)."""
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise ServiceError(Status.DEADLINE_EXCEEDED, "the deadline expired before the decision started")
        if size is not None and size > self.max_decide_bytes:
            raise ServiceError(Status.RESOURCE_EXHAUSTED, f"request is {size} bytes; a Decide/Explain request may be at most {self.max_decide_bytes}")

    async def _refuse(self, context: grpc.aio.ServicerContext, method: str, e: ServiceError) -> None:
        self.metrics.errors.labels(method, e.status.value).inc()
        code = CODES[e.status]
        diags = e.diagnostics
        if not diags and (default := default_code(method, code)) is not None:
            diags = (error(default, e.message, field=e.field),)
        # the policyc-problem lines and the standard rich error (google.rpc.Status with
        # BadRequest and ErrorInfo), cut to fit the client's metadata limit
        message, md = refusal_trailers(code, e.message, e.details, e.field, diags, e.info)
        await context.abort(code, message, trailing_metadata=tuple(md))

    # ------------------------------------------------------------------ RPCs
    async def Decide(self, request: pb.DecideRequest, context: grpc.aio.ServicerContext) -> pb.Decision:
        """Decide for a parsed request (the served method is `decide_bytes`, which gets the
        request as it came off the wire)."""
        return pb.Decision.FromString(await self.decide_bytes(request.SerializeToString(), context))

    async def prepare_new_shape(self, shapes: RequestShapes, key: bytes,
                                make_input: Callable[[], DecisionInput]) -> Prepared | None:
        """For a request shape `shapes` has not seen: parse it and get its feasibility answer
        with Z3 kept off the serving loop (a new feasibility shape is solved in the solver
        thread while the loop serves others). None when the shape is cached. Every caller
        of `decide_shape` on the loop (Decide, DecideBatch, the gateway's picker) comes here
        first, so no Z3 call runs on the loop."""
        st = self.engine.state
        if shapes.get(st, key) is not None:
            return None
        return await self.prepare_off_loop(make_input(), st)

    async def prepare_off_loop(self, inp: DecisionInput, st: PolicyState) -> Prepared:
        """`inp` parsed against `st` with its feasibility answer, Z3 kept off the serving
        loop: a shape the solver has not seen is solved in the solver thread while the
        loop serves others (Decide's new shapes, every Explain)."""
        return await self.solved(self.engine.prepare(inp, st, solve=False))

    async def solved(self, prepared: Prepared) -> Prepared:
        """`prepared` with the solver thread's answer when its feasibility was pending
        (awaited: the loop serves others meanwhile)."""
        if type(prepared.answer) is not Pending:
            return prepared
        t1 = time.perf_counter()
        answer = await asyncio.wrap_future(prepared.state.feasibility.solved(prepared.request.vars))
        return replace(prepared, answer=answer, feasibility=prepared.feasibility + time.perf_counter() - t1)

    def decide_shape(self, shapes: RequestShapes, key: bytes, make_input: Callable[[], DecisionInput],
                     t0: float, prepared: Prepared | None = None) -> tuple[Decision, ShapeEntry, Awaitable[Any] | None]:
        """One decision on the path every caller shares (the Decide RPC, the gateway's
        endpoint picker): the audit log's fail-closed check, the request-shape cache (`key`
        names the shape in `shapes`; `make_input` builds the input on a miss), the engine,
        metrics and the audit record. Returns the decision, its shape entry and, when the
        log is in sync mode, what to await before answering (it raises AuditError). Raises
        ServiceError for bad input or an audit log that refuses. Synchronous: no coroutine
        is added to Decide's hot path."""
        engine = self.engine
        st = engine.state
        entry = shapes.get(st, key)
        if entry is not None:
            d, durable = self.decide_entry(entry, t0)
            return d, entry, durable
        if self.audit is not None and (why := self.audit.refusal()) is not None:
            raise ServiceError(Status.UNAVAILABLE, why)  # the audit log fails closed
        if prepared is None or prepared.state is not st:  # (`prepared`: made by the caller for this state)
            prepared = engine.prepare(make_input(), st)
        entry = shapes.put(key, prepared)
        d = engine.decide_prepared(prepared, entry.memo)
        self.metrics.observe(d)
        durable = self.audit.record(d, entry.prepared.input.headers) if self.audit is not None else None
        return d, entry, durable

    def decide_entry(self, entry: ShapeEntry, t0: float) -> tuple[Decision, Awaitable[Any] | None]:
        """`decide_shape` for a shape found in the cache (`entry`): the audit gate, the
        engine with the shape's prepared request and match memo, metrics, the audit record."""
        audit = self.audit
        if audit is not None and (why := audit.refusal()) is not None:
            raise ServiceError(Status.UNAVAILABLE, why)  # the audit log fails closed
        d = self.engine.decide_prepared(entry.prepared, entry.memo, time.perf_counter() - t0)
        self.metrics.decisions.observe(d)
        return d, (audit.record(d, entry.prepared.input.headers) if audit is not None else None)

    def canonical_shape(self, shapes: RequestShapes, st: PolicyState,
                        raw: bytes) -> tuple[ShapeEntry | None, bytes, pb.DecideRequest]:
        """For request bytes `shapes` does not know: the request parsed, its canonical bytes
        (deterministic serialization: the headers map in key order; another client process
        writes the same request's map in its own order) and the entry kept under them, if
        any (then kept under `raw` too). Raises ServiceError for bytes that are not a
        DecideRequest."""
        msg = convert.decide_request(raw)
        key = msg.SerializeToString(deterministic=True)
        entry = shapes.get(st, key) if key != raw else None
        if entry is not None:
            shapes.alias(raw, entry)
        return entry, key, msg

    @counts_itself
    async def decide_bytes(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Decide on the serialized request, returning the serialized response.

        The raw bytes key the request-shape cache (`request_shapes.py`): a repeated shape
        skips protobuf and header parsing and the feasibility lookup, and reuses the
        matcher's answer while the registry is unchanged; it is looked up once, and a hit
        awaits nothing. Kept to one coroutine with the checks and the RPC's own counting
        inline: this is the one RPC on the hot path."""
        t0 = time.perf_counter()
        try:
            try:
                try:
                    remaining = context.time_remaining()
                    if remaining is not None and remaining <= 0:
                        raise ServiceError(Status.DEADLINE_EXCEEDED, "the deadline expired before the decision started")
                    if len(raw) > self.max_decide_bytes:
                        raise ServiceError(Status.RESOURCE_EXHAUSTED, f"request is {len(raw)} bytes; a Decide/Explain "
                                           f"request may be at most {self.max_decide_bytes}")
                    shapes = self.shapes
                    entry = shapes.get(self.engine.state, raw)
                    if entry is None:
                        entry, key, msg = self.canonical_shape(shapes, self.engine.state, raw)
                    if entry is not None:
                        d, durable = self.decide_entry(entry, t0)
                    else:
                        make_input = lambda: convert.decision_input(msg)  # noqa: E731
                        prepared = await self.prepare_off_loop(make_input(), self.engine.state)
                        d, entry, durable = self.decide_shape(shapes, key, make_input, t0, prepared)
                        if key != raw:
                            shapes.alias(raw, entry)
                except ServiceError as e:
                    await self._refuse(context, "Decide", e)
                    raise  # unreachable: abort raises
                if durable is not None:
                    try:  # sync durability: answer only once the record is on disk
                        await durable
                    except AuditError as e:
                        await self._refuse(context, "Decide", ServiceError(Status.UNAVAILABLE, str(e)))
                out = entry.response(d)
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as e:  # noqa: BLE001 - as `_no_tracebacks`, inline (no wrapper coroutine on the hot path)
                await _internal(self, context, "Decide", e)
                raise
        except BaseException:
            self.metrics.rpcs.observe("Decide", code_name(context, "UNKNOWN"), time.perf_counter() - t0)
            raise
        self.metrics.rpcs.observe("Decide", "OK", time.perf_counter() - t0)
        return out

    async def decide_batch_bytes(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """DecideBatch: every request of the batch decided as `decide_bytes` decides one
        (same shape cache, same keys: `decide_batch.split_requests` hands over each
        request's own bytes), in order, answered together. A bad request refuses the
        whole batch, naming its index."""
        t0 = time.perf_counter()
        try:
            try:
                remaining = context.time_remaining()
                if remaining is not None and remaining <= 0:
                    raise ServiceError(Status.DEADLINE_EXCEEDED, "the deadline expired before the decisions started")
                try:
                    items = split_requests(raw)
                except BadBatch as e:
                    raise ServiceError(Status.INVALID_ARGUMENT, f"malformed DecideBatchRequest: {e}") from None
                out: list[bytes] = []
                waits: list[Awaitable[Any]] = []
                shapes = self.shapes
                st = self.engine.state
                # First every request checked and every new shape parsed, its feasibility
                # queued for the solver thread at once (so the solver works through them
                # while the loop serves others, instead of one new shape at a time), and a
                # bad request refuses the batch before any decision is made or audited.
                fresh: dict[int, tuple[bytes, pb.DecideRequest, Prepared]] = {}  # new shapes: key, request, prepared
                for n, item in enumerate(items):
                    try:
                        if len(item) > self.max_decide_bytes:
                            raise ServiceError(Status.RESOURCE_EXHAUSTED, f"request is {len(item)} bytes; a Decide request may "
                                               f"be at most {self.max_decide_bytes}")
                        if shapes.get(st, item) is None:
                            known, key, msg = self.canonical_shape(shapes, st, item)
                            if known is None:
                                fresh[n] = (key, msg, self.engine.prepare(convert.decision_input(msg), st, solve=False))
                    except ServiceError as e:
                        raise ServiceError(e.status, f"request {n}: {e.message}", e.details, e.field,
                                           diagnostics=e.diagnostics) from None
                for n, item in enumerate(items):
                    try:
                        entry = shapes.get(self.engine.state, item)
                        if entry is None:
                            new = fresh.get(n)
                            if new is not None:  # (an entry made for an earlier request of the batch is found by its key)
                                key, msg, prepared = new
                                entry = shapes.get(self.engine.state, key)
                            else:  # a reload since, or evicted
                                entry, key, msg = self.canonical_shape(shapes, self.engine.state, item)
                                prepared = None
                        if entry is not None:
                            d, durable = self.decide_entry(entry, t0)
                        else:
                            make_input = lambda msg=msg: convert.decision_input(msg)  # noqa: E731
                            if prepared is None or prepared.state is not self.engine.state:
                                prepared = await self.prepare_off_loop(make_input(), self.engine.state)
                            else:
                                prepared = await self.solved(prepared)
                            d, entry, durable = self.decide_shape(shapes, key, make_input, t0, prepared)
                            if key != item:
                                shapes.alias(item, entry)
                    except ServiceError as e:
                        raise ServiceError(e.status, f"request {n}: {e.message}", e.details, e.field,
                                           diagnostics=e.diagnostics) from None
                    if durable is not None:
                        waits.append(durable)
                    out.append(entry.response(d))
                    t0 = time.perf_counter()
            except ServiceError as e:
                await self._refuse(context, "DecideBatch", e)
                raise  # unreachable: abort raises
            for w in waits:
                try:  # sync durability: answer only once every record is on disk
                    await w
                except AuditError as e:
                    await self._refuse(context, "DecideBatch", ServiceError(Status.UNAVAILABLE, str(e)))
            return join_decisions(out)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as e:  # noqa: BLE001 - as `_no_tracebacks`, inline (no wrapper coroutine on the hot path)
            await _internal(self, context, "DecideBatch", e)
            raise

    @_no_tracebacks
    async def MatchAll(self, request: pb.MatchAllRequest, context: grpc.aio.ServicerContext) -> pb.MatchAllResponse:
        """`Registry.matches` over gRPC: the request parsed as Decide parses it, then the
        index's candidate set (its cost is the index's, not a ranked walk)."""
        try:
            self._admit(context, Permission.LIST, request.request.ByteSize())
            st = self.engine.state
            req, _ = to_request(st.registry, st.bundle, convert.decision_input(request.request))
        except ServiceError as e:
            await self._refuse(context, "MatchAll", e)
            raise
        found = st.registry.matches(req, "ids")  # the id column gathered, no instance objects
        assert found.ids is not None
        ids = (found.ids if not request.limit else found.ids[:request.limit]).tolist()
        return pb.MatchAllResponse(count=found.count, instance_ids=ids, rules=convert.matched_rules(found.bundle_hash, found.rules),
                                   bundle_hash=found.bundle_hash)

    @_no_tracebacks
    async def Explain(self, request: pb.DecideRequest, context: grpc.aio.ServicerContext) -> pb.Explanation:
        try:
            self._admit(context, Permission.EXPLAIN, request.ByteSize())
            inp = convert.decision_input(request)
            a = self.engine.explain(inp, await self.prepare_off_loop(inp, self.engine.state))  # no Z3 on the loop
        except ServiceError as e:
            await self._refuse(context, "Explain", e)
            raise
        return convert.account(a)

    @_no_tracebacks
    async def RegisterInstance(self, request: pb.RegisterInstanceRequest, context: grpc.aio.ServicerContext) -> pb.RegisterInstanceResponse:
        try:
            self._admit(context, Permission.REGISTER)
            bundle = self.engine.state.bundle
            inst, model, score, unverified = await self._checked_registration(request, bundle)
            shared = getattr(self.engine, "register_shared", None)  # a replica: the fleet store's write, awaited off the loop
            rid = request_id_of(context.invocation_metadata())  # a retry with the same id converges
            size = await shared(inst, score, rid) if shared is not None else self.engine.register(inst, score)
        except ServiceError as e:
            await self._refuse(context, "RegisterInstance", e)
            raise
        return pb.RegisterInstanceResponse(instance_id=inst.id, model=model, registry_size=size, bundle_hash=bundle.content_hash,
                                           unverified_facts=unverified)

    @_no_tracebacks
    async def RegisterInstances(self, request: pb.RegisterInstancesRequest,
                                context: grpc.aio.ServicerContext) -> pb.RegisterInstancesResponse:
        """Each item checked as RegisterInstance checks it; the admitted ones in one batch
        (`bulk_registration.py`); a refused item is named in its result, not raised."""
        try:
            self._admit(context, Permission.REGISTER)
            return await register_instances(self, request, context)
        except ServiceError as e:
            await self._refuse(context, "RegisterInstances", e)
            raise

    async def _checked_registration(self, request: pb.RegisterInstanceRequest,
                                    bundle: Bundle) -> tuple[Instance, str, float | None, tuple[str, ...]]:
        """RegisterInstance's checks of one item, in its order: (instance, model, score,
        unverified facts), or ServiceError naming the problem."""
        which = request.WhichOneof("contract")
        model = request.model
        if which == "contract_json":
            model = check_against_bundle(contract_from_json(request.contract_json), model, bundle)
        elif which == "onnx_model":
            model = check_against_bundle(contract_from_onnx(request.onnx_model), model, bundle)
            await asyncio.to_thread(check_counted_cost, request.onnx_model)  # the gate recounts (cached per file)
        elif not model:
            raise ServiceError(Status.INVALID_ARGUMENT, "give `model`, `contract_json` or `onnx_model`", field="model")
        d = request.deployment
        if d.host:  # the endpoint's rules first: each is named (the syntax is convert's)
            self.endpoints.check(request.id, d.endpoint, d.host, self.topology())
        inst = convert.instance(request, model)
        # facts checked against the telemetry that knows them; a deployment that cannot
        # serve its contract at all is refused by the registry first, saying what it needs
        unverified = check_facts(inst, self.topology()) if admissible(inst, bundle) else ()
        score = request.score if request.HasField("score") else None
        if score is not None and not 0.0 <= score <= 1.0:
            raise ServiceError(Status.INVALID_ARGUMENT, f"score must be in [0, 1], got {score}", field="score")
        return inst, model, score, tuple(unverified)

    @_no_tracebacks
    async def DeregisterInstance(self, request: pb.DeregisterInstanceRequest, context: grpc.aio.ServicerContext) -> pb.DeregisterInstanceResponse:
        try:
            self._admit(context, Permission.REGISTER)
            shared = getattr(self.engine, "deregister_shared", None)
            rid = request_id_of(context.invocation_metadata())
            size = await shared(request.instance_id, rid) if shared is not None else self.engine.deregister(request.instance_id)
        except ServiceError as e:
            await self._refuse(context, "DeregisterInstance", e)
            raise
        return pb.DeregisterInstanceResponse(registry_size=size)

    @_no_tracebacks
    async def ReloadBundle(self, request: pb.ReloadBundleRequest, context: grpc.aio.ServicerContext) -> pb.ReloadBundleResponse:
        try:
            self._admit(context, Permission.RELOAD)
            which = request.WhichOneof("source")
            try:  # parsing and reading run in a worker thread: a 35 MB bundle or a slow file never stalls Decide
                if which == "bundle_json":
                    bundle = await asyncio.to_thread(self.verifier.load_text, request.bundle_json, "<ReloadBundle>")
                elif which == "path":
                    bundle = await asyncio.to_thread(self._load_bundle, request.path)
                else:
                    raise ServiceError(Status.INVALID_ARGUMENT, "give `bundle_json` or `path`")
            except bundle_io.BundleError as e:
                self._reload_refused("ReloadBundle", str(e))
                raise ServiceError(Status.INVALID_ARGUMENT, str(e)) from None
            prev, evicted = await self.reload(bundle, request.evict_inadmissible, source="ReloadBundle")
        except ServiceError as e:
            await self._refuse(context, "ReloadBundle", e)
            raise
        return pb.ReloadBundleResponse(previous_hash=prev, bundle_hash=bundle.content_hash, evicted=list(evicted),
                                       registry_size=len(self.engine.state.registry))

    @_no_tracebacks
    async def ListInstances(self, request: pb.ListInstancesRequest, context: grpc.aio.ServicerContext) -> pb.ListInstancesResponse:
        try:
            self._admit(context, Permission.LIST)
        except ServiceError as e:
            await self._refuse(context, "ListInstances", e)
            raise
        st = self.engine.state
        out = [pb.InstanceInfo(id=inst.id, model=inst.model, deployment=convert.deployment_msg(inst.deployment),
                               labels=inst.labels, score=score)
               for inst, _, score in st.registry.entries() if not request.model or inst.model == request.model]
        out.sort(key=lambda i: i.id)
        return pb.ListInstancesResponse(instances=out, bundle_hash=st.bundle_hash)

    @_no_tracebacks
    async def ListHosts(self, request: pb.ListHostsRequest, context: grpc.aio.ServicerContext) -> pb.ListHostsResponse:
        """The hosts of the topology registration checks facts against, so an operator can
        see what `instance register` may claim (read-only: auditor or operator)."""
        try:
            self._admit(context, Permission.LIST)
        except ServiceError as e:
            await self._refuse(context, "ListHosts", e)
            raise
        return hosts_msg(self.topology(), request.region)

    async def reload_path(self, path: str, source: str = "SIGHUP") -> tuple[str, tuple[str, ...]]:
        """Load `path` through the service's verifier (off the loop) and swap to it; a
        refusal keeps the old bundle, counts, is audited and raises BundleError."""
        try:
            bundle = await asyncio.to_thread(self._load_bundle, path)
        except bundle_io.BundleError as e:
            self._reload_refused(source, str(e))
            raise
        return await self.reload(bundle, source=source)

    def _reload_refused(self, source: str, reason: str) -> None:
        self.metrics.reloads.labels("refused").inc()
        log.warning("bundle reload refused (%s), still serving %s: %s", source, self.engine.state.bundle_hash[:19], reason)
        if self.audit is not None:
            self.audit.bundle_reload(False, source, reason)

    async def reload(self, bundle: Bundle, evict: bool = False, source: str = "reload") -> tuple[str, tuple[str, ...]]:
        """Swap to an already verified bundle, off the event loop."""
        async with self._reload_lock:
            try:
                prev, evicted = await asyncio.to_thread(self.engine.reload, bundle, evict_inadmissible=evict)
            except ServiceError as e:
                self._reload_refused(source, e.message)
                raise
            st = self.engine.state  # the old shapes, prepared again for it off the loop: a warm table
            self.shapes.adopt(st, await asyncio.to_thread(self.shapes.rebuilt, self.engine, st))
            self.metrics.reloads.labels("ok").inc()
            self.metrics.set_bundle(prev, bundle.content_hash)
            if self.audit is not None:
                self.audit.bundle = bundle
                self.audit.bundle_reload(True, source, f"{prev[:19]} -> {bundle.content_hash[:19]}"
                                         + (f", {len(evicted)} evicted" if evicted else ""))
            return prev, evicted
