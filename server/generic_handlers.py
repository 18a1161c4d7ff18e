"""Services added to a grpc.aio server as generic handlers only, never as registered methods.

grpc.aio's server keeps one pending request-call per registered method beside the one for
generic handlers, and after every call it waits on all of them again
(`asyncio.wait(..., return_when=FIRST_COMPLETED)`: a done-callback added to and removed
from each pending task). With the Decisions service's 8 methods, health's 2 and
reflection's 1 registered, every call paid that wait over 12 tasks on the serving loop;
with generic handlers only, over 1 (measured: `benchmarks/serve.py`). A generic handler
costs a dictionary look-up by method name instead, and clients see the same service.

`GenericOnly(server)` is what the generated `add_*Servicer_to_server` functions get: it
passes their generic handler on and drops the registration.
"""

from __future__ import annotations

from typing import Sequence

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc


class GenericOnly:
    """The part of a `grpc.aio.Server` that generated code adds services through."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        """Dropped: the generic handler added beside it serves the same methods."""


def add_health(servicer: health_pb2_grpc.HealthServicer, server: grpc.aio.Server) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(servicer, GenericOnly(server))


def add_reflection(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Server reflection (grpc.aio's servicer, as `reflection.enable_server_reflection` picks
    for an aio server) for `service_names`."""
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection.aio.ReflectionServicer(service_names),
                                                              GenericOnly(server))
