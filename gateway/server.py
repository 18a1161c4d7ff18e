"""The picker's gRPC server, next to a running `DecisionServer` and on its event loop: one
engine, one bundle, one registry, one audit log for `Decide` and for the gateway.

Its own port (Envoy's ext_proc cluster points there; the decision API keeps its tokens
and roles) with the Endpoint Picker Protocol's health services: `liveness` (the process
answers), `readiness`, `envoy.service.ext_proc.v3.ExternalProcessor` and `""` (ready to
pick: the decision service is ready and the pool has an instance with an endpoint).
"""

from __future__ import annotations

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpc_health.v1 import health

from policyc.server.app import DecisionServer
from policyc.server.generic_handlers import add_health
from policyc.server.readiness import Readiness
from policyc.server.transport import TransportError

from .acts import Acts
from .messages import serialize
from .picker import EndpointPicker, PickerConfig, RuleTables

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
UNIX_PATH_MAX = 107  # sockaddr_un.sun_path, less its terminating NUL


class PickerServer:
    """`await start()` → port (on the decision server's loop); `await stop()`."""

    def __init__(self, decision: DecisionServer, config: PickerConfig = PickerConfig()) -> None:
        self.decision = decision
        self.config = config
        g = decision.guardian
        tables = RuleTables((lambda: g.table) if g is not None else None, lambda: decision.engine.state.bundle)
        audit = decision.audit
        self.acts = Acts(decision.placer, audit.log if audit is not None else None, decision.engine.state.bundle)
        decision.engine.on_reload(lambda st: setattr(self.acts, "bundle", st.bundle))
        self.picker = EndpointPicker(decision.service, tables, self.acts, config)
        self.health = health.aio.HealthServicer()
        self.readiness = Readiness(self.health, ("", EXT_PROC_SERVICE), interval=0.2)
        self.readiness.add("decision service", self._decision_ready)
        self.readiness.add("pool", lambda: None if self.picker.pool.endpoints() else
                           "no instance with an endpoint is registered (RegisterInstance with deployment.endpoint)")
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None

    def _decision_ready(self) -> str | None:
        r = self.decision.readiness
        return None if r.ready else ("; ".join(r.reasons) or "not yet checked")

    async def start(self) -> int:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        # the stubs' handler, but with a serializer that also takes the picker's pre-serialized answers, and
        # registered as unary-request: grpc hands the handler the stream's first message and `context.read()`
        # reads the rest (the same bidirectional stream on the wire; no request iterator, no first read of
        # the handler's own: less CPU per stream in benchmarks/gateway_hop.py, `aio-unary-in`)
        process = grpc.unary_stream_rpc_method_handler(self.picker.Process, request_deserializer=ep.ProcessingRequest.FromString,
                                                       response_serializer=serialize)
        if self.config.headers_only and self.picker.from_access_log and self.picker.llm is None:
            # the request's headers are each stream's only message each way: unary-unary, so grpc sends the
            # answer and the stream's end in one batch (benchmarks/gateway_hop.py, `aio-unary`)
            process = grpc.unary_unary_rpc_method_handler(self.picker.ProcessHeaders,
                                                          request_deserializer=ep.ProcessingRequest.FromString,
                                                          response_serializer=serialize)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(EXT_PROC_SERVICE, {"Process": process}),))
        add_health(self.health, server)  # as a generic handler: no registered method's request-call to wait on after every call
        try:
            port = server.add_insecure_port(f"{self.config.host}:{self.config.port}")
        except RuntimeError as e:
            raise TransportError(f"the endpoint picker cannot listen on {self.config.host}:{self.config.port}: {e}") from None
        if port == 0:
            raise TransportError(f"the endpoint picker cannot listen on {self.config.host}:{self.config.port} (in use?)")
        if self.config.unix_socket is not None:
            self._add_unix_socket(server, self.config.unix_socket)
        await server.start()
        self._server, self.port = server, port
        await self.readiness.start()
        return port

    @staticmethod
    def _add_unix_socket(server: grpc.aio.Server, path: str) -> None:
        """The same services on a Unix socket: Envoy's ext_proc stream per request then costs
        both processes fewer system calls than over TCP loopback (measured in
        benchmarks/gateway.py: ~5 % less CPU per request in each)."""
        if len(path.encode()) > UNIX_PATH_MAX:
            raise TransportError(f"the endpoint picker's Unix socket path is {len(path.encode())} bytes, "
                                 f"the limit is {UNIX_PATH_MAX}: {path}")
        try:
            bound = server.add_insecure_port(f"unix:{path}")
        except RuntimeError as e:
            raise TransportError(f"the endpoint picker cannot listen on unix:{path}: {e}") from None
        if bound == 0:
            raise TransportError(f"the endpoint picker cannot listen on unix:{path}")

    async def stop(self, grace: float = 1.0) -> None:
        self.readiness.stop()
        if self._server is not None:
            await self.health.enter_graceful_shutdown()
            await self._server.stop(grace)
            self._server = None
