"""An OTLP/gRPC trace receiver for the gateway benchmark's `--otlp` rounds: the collector's
`TraceService` on a loopback port, counting the spans it is sent, in a process of its own
(as a collector would be), so what it spends is not counted as policyc's.

It keeps each `Export` call's bytes as they came and decodes them only when told to stop,
after the measured rounds: a collector runs on another machine, and one that decoded every
span here (~25-40 µs of CPU a traced request with the benchmark's 3 + 5 spans, measured)
would take that CPU from the gateway it is measuring on the same two cores.

    .venv/bin/python benchmarks/otlp_sink.py   # prints `port N`; on SIGTERM, `spans N` and exits
"""

from __future__ import annotations

import signal
import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts

EXPORT_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
EMPTY_RESPONSE = ts.ExportTraceServiceResponse().SerializeToString()


class Sink:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []  # appended by gRPC's threads (list.append is atomic)

    def export(self, body: bytes, context: Any) -> bytes:
        self.bodies.append(body)
        return EMPTY_RESPONSE

    def spans(self) -> int:
        """The spans received: each kept request decoded now (the protocol's own classes)."""
        n = 0
        for body in self.bodies:
            req = ts.ExportTraceServiceRequest.FromString(body)
            n += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        return n


def main() -> None:
    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    # the method registered without (de)serializers: the request arrives as its bytes
    handler = grpc.unary_unary_rpc_method_handler(sink.export, request_deserializer=None, response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(EXPORT_SERVICE, {"Export": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"port {port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    server.stop(grace=1.0)
    print(f"spans {sink.spans()}", flush=True)


if __name__ == "__main__":
    main()
