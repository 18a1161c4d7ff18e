"""An OTLP/gRPC trace receiver for the gateway benchmark's `--otlp` rounds: the collector's
`TraceService` on a loopback port, counting the spans it is sent, in a process of its own
(as a collector would be), so what it spends is not counted as policyc's.

    .venv/bin/python benchmarks/otlp_sink.py   # prints `port N`; on SIGTERM, `spans N` and exits
"""

from __future__ import annotations

import signal
import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc


class Sink(ts_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self.lock = threading.Lock()

    def Export(self, request: ts.ExportTraceServiceRequest, context: Any) -> ts.ExportTraceServiceResponse:  # noqa: N802
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self.lock:
            self.spans += n
        return ts.ExportTraceServiceResponse()


def main() -> None:
    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ts_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"port {port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    server.stop(grace=1.0)
    print(f"spans {sink.spans}", flush=True)


if __name__ == "__main__":
    main()
