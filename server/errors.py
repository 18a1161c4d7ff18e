"""Errors the decision service reports to callers, each with a precise status.

The engine raises `ServiceError(Status.X, message, details)`; the gRPC layer maps `Status`
to a gRPC status code and puts `details` (one line per problem, e.g. per header) into the
trailing metadata. Nothing a caller sends ever becomes a traceback.
"""

from __future__ import annotations

from enum import Enum

from policyc.compiler.diagnostic import Diagnostic, error


class Status(str, Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # malformed or unknown headers, bad attributes, bad contract
    NOT_FOUND = "NOT_FOUND"  # unknown tenant, model or instance
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # deployment does not satisfy its contract; contract drift
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # oversize messages
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNAVAILABLE = "UNAVAILABLE"


class ServiceError(Exception):
    """`diagnostics`: the problems in the one Diagnostic shape (code, message, field), which
    the gRPC layer sends as a `google.rpc.Status` (`rich_status.py`); with `code` alone, one
    is made from the message and the field."""

    def __init__(self, status: Status, message: str, details: tuple[str, ...] = (), field: str | None = None, *,
                 code: str | None = None, diagnostics: tuple[Diagnostic, ...] = (),
                 info: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.info = info or {}  # extra ErrorInfo metadata (e.g. an unknown outcome's request id)
        self.status = status
        self.message = message
        self.details = details
        self.field = field  # the offending field, when one is named (e.g. `memory.bandwidth_min`)
        if not diagnostics and code is not None:
            diagnostics = (error(code, message, field=field),)
        self.diagnostics = diagnostics
