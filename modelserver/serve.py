"""One model-server process: KServe's data plane, REST server and gRPC servicer around
policyc's `OnnxModel`s, listening on loopback (or a chosen host).

Why not `kserve.ModelServer.start`: it binds every interface, picks fixed ports, and its
gRPC servicer drops the response headers a model returns. Here the same KServe parts —
`ModelRepository`, `DataPlane`, `RESTServer` (v2 REST, `/metrics`, its error handlers),
`InferenceServicer` and `ExceptionToStatusInterceptor` — are assembled so that:

- each instance has its own gRPC port (its own `DataPlane` over a repository holding
  only that instance's model and aliases), so a gateway that steers by `ip:port` reaches
  exactly the instance it chose, even when one process serves several (two replicas of
  one model included); the REST port is the process's (KServe's FastAPI app is one per
  process) and serves each model name exactly one of its instances answers;
- ports may be 0 (the kernel picks; the process reports them in its ready file), so
  parallel test sessions never race for a port;
- gRPC answers carry the model's response headers as initial metadata (HTTP/2 response
  headers that Envoy can log and route on);
- SIGTERM/SIGINT stop both servers and the process exits 0;
- no request can take the process down (see `bounds.py`): REST bodies pass `RestGuard`
  first (body bound, then the infer request against its model's bounds, 413 / 400),
  gRPC `ModelInfer` is checked against the same bounds before KServe decodes it
  (INVALID_ARGUMENT), gRPC messages are at most `GRPC_MAX_RECEIVE`, the model repository
  cannot be changed by a client, and a client's error is one log line (`refusals.py`).

Import this module only after the process's own arguments are parsed: importing KServe
parses `sys.argv` (`kserve.model_server` does so at import).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from kserve.errors import InvalidInput
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2 as oip
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as oip_grpc
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.infer_type import InferRequest, InferResponse
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.server import RESTServer
from kserve.utils.utils import to_headers

from . import wire
from .bounds import GRPC_MAX_RECEIVE, GRPC_MAX_SEND, BoundError, Bounds, TooLarge, check_grpc
from .onnx_model import OnnxModel
from .refusals import OneLineExceptionToStatus, RequestTooLarge, install_rest_handlers
from .rest_guard import RestGuard
from .tracing import ServerTracer, from_environment

log = logging.getLogger("policyc.modelserver")
_tracer: ServerTracer | None = None  # set in `serve` when the OpenTelemetry environment asks for traces


@dataclass(frozen=True, slots=True)
class Listen:
    host: str = "127.0.0.1"
    http_port: int = 0
    ready_file: Path | None = None


@dataclass(frozen=True, slots=True)
class Hosted:
    """One instance of the process: its model, the other names it answers, its gRPC port."""

    model: OnnxModel
    aliases: tuple[str, ...] = ()
    grpc_port: int = 0

    @property
    def names(self) -> tuple[str, ...]:
        return (self.model.name, *self.aliases)


def check_names(hosted: list[Hosted]) -> None:
    """ValueError when two instances of one process share an instance id."""
    seen: set[str] = set()
    for h in hosted:
        if h.model.instance_id in seen:
            raise ValueError(f"instance `{h.model.instance_id}` given twice in one process")
        seen.add(h.model.instance_id)


def rest_names(hosted: list[Hosted]) -> dict[str, Hosted]:
    """The model names the process's REST port serves: those exactly one of its instances
    answers (a name two instances answer is reached through each one's gRPC endpoint)."""
    count: dict[str, int] = {}
    for h in hosted:
        for n in h.names:
            count[n] = count.get(n, 0) + 1
    return {n: h for h in hosted for n in h.names if count[n] == 1}


class PolicycInferenceServicer(InferenceServicer):
    """KServe's servicer, except that `ModelInfer` checks the request against its model's
    bounds before anything decodes it and sends the model's response headers, and that the
    model repository cannot be changed by a client."""

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._no_repository(context)

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._no_repository(context)

    @staticmethod
    async def _no_repository(context: grpc.aio.ServicerContext) -> None:
        log.warning("refused gRPC repository change from %s", context.peer())
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this model server serves the instances it was started "
                                                                "with: its model repository is not changed by clients")

    async def ModelInfer(self, request: oip.ModelInferRequest,  # noqa: N802 (the OIP method name)
                         context: grpc.aio.ServicerContext) -> oip.ModelInferResponse:
        headers = to_headers(context)
        model = self._data_plane.model_registry.get_model(request.model_name)
        if isinstance(model, OnnxModel) and model.ready:
            try:
                check_grpc(request, model.bounds)
            except TooLarge as e:
                raise RequestTooLarge(str(e)) from None
            except BoundError as e:
                raise InvalidInput(str(e)) from None
        self.validate_grpc_request(request)
        span = _tracer.start(headers, request.model_name) if _tracer is not None else None
        try:
            body, response_headers = await self._data_plane.infer(
                request=InferRequest.from_grpc(request), headers=headers, model_name=request.model_name)
        finally:
            if span is not None:  # the caller's trace goes on through the inference (modelserver/tracing.py)
                span.end()
        shown = tuple((k, str(v)) for k, v in response_headers.items() if k in wire.RESPONSE_HEADERS)
        if shown:
            await context.send_initial_metadata(shown)
        if isinstance(body, InferResponse):
            return body.to_grpc()
        if isinstance(body, oip.ModelInferResponse):
            return body
        raise TypeError(f"model `{request.model_name}` answered a {type(body).__name__}, not an InferResponse")


def _repository(names: dict[str, Hosted]) -> ModelRepository:
    repo = ModelRepository()
    for n, h in names.items():
        repo.update(h.model, n)
    return repo


def _grpc_server(h: Hosted, host: str) -> tuple[grpc.aio.Server, int]:
    plane = DataPlane(model_registry=_repository(dict.fromkeys(h.names, h)))
    ext = ModelRepositoryExtension(model_registry=plane.model_registry)
    server = grpc.aio.server(
        interceptors=(OneLineExceptionToStatus(),),
        options=[("grpc.max_send_message_length", GRPC_MAX_SEND),
                 ("grpc.max_receive_message_length", GRPC_MAX_RECEIVE),
                 ("grpc.so_reuseport", 0)],
    )
    oip_grpc.add_GRPCInferenceServiceServicer_to_server(PolicycInferenceServicer(plane, ext), server)
    port = server.add_insecure_port(f"{host}:{h.grpc_port}")
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{h.grpc_port}")
    return server, port


def _http_socket(listen: Listen) -> socket.socket:
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((listen.host, listen.http_port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _bounds_facts(b: Bounds) -> dict[str, int]:
    """An instance's request bounds as its ready file states them (see `bounds.py`)."""
    return {"max_sequence": b.max_sequence, "max_tokens": b.max_tokens, "max_answer_bytes": b.max_answer_bytes,
            "rest_body_bytes": b.rest_body_bytes, "grpc_max_receive": GRPC_MAX_RECEIVE}


def _announce(path: Path, facts: dict[str, object]) -> None:
    """Write the ready file atomically: a reader sees all of it or none."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(facts, sort_keys=True))
    os.replace(tmp, path)


async def _run(hosted: list[Hosted], listen: Listen) -> None:
    # uvicorn captures SIGTERM/SIGINT while it serves, then restores the previous handler and
    # raises the signal again: from here on that must be a no-op, not an exit mid-shutdown.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: None)
    grpcs = [_grpc_server(h, listen.host) for h in hosted]
    rest = rest_names(hosted)
    plane = DataPlane(model_registry=_repository(rest))
    ext = ModelRepositoryExtension(model_registry=plane.model_registry)
    sock = _http_socket(listen)
    http_port = sock.getsockname()[1]
    rest_server = RESTServer("kserve.model_server:app", plane, ext, http_port, grace_period=1, timeout_keep_alive=65)
    rest_server.create_application()
    from kserve.model_server import app  # the FastAPI app create_application built on

    install_rest_handlers(app)
    uv = rest_server._server  # KServe's uvicorn server: serving a socket we bound needs it (RESTServer.start cannot)
    uv.config.app = RestGuard(app, {n: h.model.bounds for n, h in rest.items()})
    for server, _ in grpcs:
        await server.start()
    serving = asyncio.create_task(uv.serve(sockets=[sock]))
    while not uv.started and not serving.done():
        await asyncio.sleep(0.005)
    if serving.done():
        await serving  # uvicorn failed to start: let its error out
    facts = {"pid": os.getpid(), "host": listen.host, "http_port": http_port, "rest_models": sorted(rest),
             "instances": [{"instance": h.model.instance_id, "model": h.model.name, "contract": h.model.contract.name,
                            "variants": list(h.model.variants), "aliases": list(h.aliases), "grpc_port": port,
                            "bounds": _bounds_facts(h.model.bounds)}
                           for h, (_, port) in zip(hosted, grpcs)]}
    for h, (_, port) in zip(hosted, grpcs):
        log.info("instance %s: model %s%s on grpc %s:%d", h.model.instance_id, h.model.name,
                 f" (also {', '.join(h.aliases)})" if h.aliases else "", listen.host, port)
    log.info("REST on http %s:%d for %s", listen.host, http_port, ", ".join(sorted(rest)) or "no model (every name is shared)")
    if listen.ready_file is not None:
        _announce(listen.ready_file, facts)
    try:
        await serving  # returns once uvicorn saw SIGTERM/SIGINT and shut down
    finally:
        await asyncio.gather(*(server.stop(grace=0.5) for server, _ in grpcs))
        sock.close()


def serve(hosted: list[Hosted], listen: Listen) -> None:
    """Load the models, serve until SIGTERM or SIGINT; returns after every server stopped."""
    check_names(hosted)

    def before_serving(sig: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, before_serving)
    global _tracer
    _tracer = from_environment()
    try:
        for h in hosted:
            h.model.load()
        asyncio.run(_run(hosted, listen))
    except SystemExit:
        pass
    finally:
        if _tracer is not None:  # the last spans out
            _tracer.shutdown()
