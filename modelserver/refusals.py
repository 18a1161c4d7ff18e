"""A client's error is one line in the model server's log, and its status names it.

KServe's REST exception handlers and its gRPC `ExceptionToStatusInterceptor` log every
refusal with its traceback (`exc_info`): a client sending bad requests filled the log with
stack traces and buried the server's own faults. Here the errors a client causes — a
malformed or oversized request (`InvalidInput`, and `RequestTooLarge` for one over a
declared bound), an unknown or unready model, a method the server does not offer — are
logged as one line and answered with their status: REST 400 / 413 / 404 / 503 / 501,
gRPC INVALID_ARGUMENT / NOT_FOUND / UNAVAILABLE / UNIMPLEMENTED. Anything else is the
server's fault: logged with its traceback, answered 500 / INTERNAL without it.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from kserve.errors import InvalidInput, ModelNotFound, ModelNotReady, ServerNotLive, ServerNotReady, UnsupportedProtocol
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor

log = logging.getLogger("policyc.modelserver")


class RequestTooLarge(InvalidInput):
    """A request over one of its model's declared bounds (`bounds.TooLarge`): REST 413."""


# client errors: (REST status, gRPC status), most specific first
CLIENT_ERRORS: tuple[tuple[type[Exception], HTTPStatus, grpc.StatusCode], ...] = (
    (RequestTooLarge, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidInput, HTTPStatus.BAD_REQUEST, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFound, HTTPStatus.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
    (ModelNotReady, HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (ServerNotReady, HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (ServerNotLive, HTTPStatus.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
    (UnsupportedProtocol, HTTPStatus.NOT_IMPLEMENTED, grpc.StatusCode.UNIMPLEMENTED),
    (NotImplementedError, HTTPStatus.NOT_IMPLEMENTED, grpc.StatusCode.UNIMPLEMENTED),
)


def classify(exc: BaseException) -> tuple[HTTPStatus, grpc.StatusCode] | None:
    """The statuses of a client's error; None for the server's own fault."""
    for kind, http, code in CLIENT_ERRORS:
        if isinstance(exc, kind):
            return http, code
    return None


def reason(exc: BaseException) -> str:
    """The one-line text of an error (KServe's errors keep theirs in `reason`)."""
    text = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
    return " ".join(text.split())[:2000]


def install_rest_handlers(app: FastAPI) -> None:
    """Replace KServe's handlers (which log tracebacks) on its FastAPI app."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        statuses = classify(exc)
        client = request.client
        where = f"{request.method} {request.url.path[:200]} from {client.host}:{client.port}" if client else request.url.path[:200]
        if statuses is None:
            log.error("REST %s: internal error", where, exc_info=exc)
            return JSONResponse(status_code=HTTPStatus.INTERNAL_SERVER_ERROR, content={"error": "internal error"})
        log.warning("refused REST %s: %d %s", where, statuses[0].value, reason(exc))
        return JSONResponse(status_code=statuses[0].value, content={"error": reason(exc)})

    for kind, _, _ in CLIENT_ERRORS:
        app.add_exception_handler(kind, handle)
    app.add_exception_handler(Exception, handle)


class OneLineExceptionToStatus(ExceptionToStatusInterceptor):
    """KServe's gRPC interceptor, with a client's errors logged as one line."""

    async def handle_exception(self, ex: Exception, request_or_iterator: Any, context: grpc.aio.ServicerContext,
                               method_name: str) -> None:
        if isinstance(ex, grpc.aio.AbortError):  # the method set its status itself (and said why)
            raise ex
        statuses = classify(ex)
        if statuses is None:
            await super().handle_exception(ex, request_or_iterator, context, method_name)
            return
        peer = context.peer() if hasattr(context, "peer") else "?"
        log.warning("refused gRPC %s from %s: %s %s", method_name, peer, statuses[1].name, reason(ex))
        await context.abort(statuses[1], reason(ex))
