"""The Decisions service's method table: the generated one, except that `Decide` takes and
returns raw bytes.

`Decide` is the hot path. Served with bytes in and out, the service parses the request
only when its shape is new (`request_shapes.py`) and serializes the response itself, and
the raw request keys the shape cache. Clients see the same wire messages; reflection
still describes the method from the proto's descriptors.
"""

from __future__ import annotations

import grpc

from .auth import Access, GuardedHandler
from .proto import SERVICE_NAME, pb
from .request_decode import decoder
from .rpc_metrics import timed_handlers
from .service import DecisionService


def method_handlers(service: DecisionService) -> dict[str, grpc.RpcMethodHandler]:
    u = grpc.unary_unary_rpc_method_handler
    return {
        "Decide": u(service.decide_bytes),  # bytes in, bytes out
        "DecideBatch": u(service.decide_batch_bytes),  # bytes in, bytes out (`decide_batch.py` splits and joins)
        "MatchAll": u(service.MatchAll, request_deserializer=decoder(pb.MatchAllRequest),
                      response_serializer=pb.MatchAllResponse.SerializeToString),
        "Explain": u(service.Explain, request_deserializer=decoder(pb.DecideRequest),
                     response_serializer=pb.Explanation.SerializeToString),
        "RegisterInstance": u(service.RegisterInstance, request_deserializer=decoder(pb.RegisterInstanceRequest),
                              response_serializer=pb.RegisterInstanceResponse.SerializeToString),
        "RegisterInstances": u(service.RegisterInstances, request_deserializer=decoder(pb.RegisterInstancesRequest),
                               response_serializer=pb.RegisterInstancesResponse.SerializeToString),
        "DeregisterInstance": u(service.DeregisterInstance, request_deserializer=decoder(pb.DeregisterInstanceRequest),
                                response_serializer=pb.DeregisterInstanceResponse.SerializeToString),
        "ReloadBundle": u(service.ReloadBundle, request_deserializer=decoder(pb.ReloadBundleRequest),
                          response_serializer=pb.ReloadBundleResponse.SerializeToString),
        "ListInstances": u(service.ListInstances, request_deserializer=decoder(pb.ListInstancesRequest),
                           response_serializer=pb.ListInstancesResponse.SerializeToString),
        "ListHosts": u(service.ListHosts, request_deserializer=decoder(pb.ListHostsRequest),
                       response_serializer=pb.ListHostsResponse.SerializeToString),
    }


def add_decisions_service(service: DecisionService, server: grpc.aio.Server, access: Access = Access()) -> None:
    """Add the service as a generic handler only (not also as registered methods, as the
    generated `add_DecisionsServicer_to_server` does: see `generic_handlers.py`), each
    method handed out only to callers whose role may call it (`auth.GuardedHandler`)."""
    handlers = timed_handlers(method_handlers(service), service.metrics.rpcs)  # per-RPC counts and latency
    guarded = GuardedHandler(SERVICE_NAME, handlers, access, lambda m, st: service.metrics.errors.labels(m, st).inc())
    server.add_generic_rpc_handlers((guarded,))
