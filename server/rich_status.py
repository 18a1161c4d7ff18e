"""A refusal as the standard rich gRPC error: a `google.rpc.Status` in the
`grpc-status-details-bin` trailer, which `grpc_status.rpc_status.from_call()` (and every
other gRPC stack's status helper) reads.

The details are the refusal's `Diagnostic`s, the one shape the compiler and the CLI use:
a `google.rpc.BadRequest` with one field violation per problem that names a field (a
request header, a registration field; its `reason` is the problem's policyc code from
`policyc.compiler.codes`), and a `google.rpc.ErrorInfo` whose `reason` is the first code.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from policyc.compiler.diagnostic import Diagnostic

DOMAIN = "policyc"
TRAILER = "grpc-status-details-bin"
MAX_DETAILS = 32  # problems sent in detail; the message still counts all of them
MAX_TEXT = 1000


def rich_status(code: grpc.StatusCode, message: str, diagnostics: Iterable[Diagnostic]) -> status_pb2.Status:
    """`message` must be the status details the call is aborted with, word for word
    (`from_call` checks that the two agree). One `ErrorInfo`, for the first problem (its
    code is the `reason`; `codes` in its metadata lists every problem's), and one
    `BadRequest` whose violations each carry their own code as `reason`."""
    diags = list(diagnostics)[:MAX_DETAILS]
    st = status_pb2.Status(code=code.value[0], message=message)
    if not diags:
        return st
    violations = [error_details_pb2.BadRequest.FieldViolation(field=d.field, description=d.message[:MAX_TEXT], reason=d.code)
                  for d in diags if d.field]
    if violations:
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.BadRequest(field_violations=violations))
        st.details.append(packed)
    first = diags[0]
    info = error_details_pb2.ErrorInfo(reason=first.code, domain=DOMAIN,
                                       metadata={"codes": ",".join(d.code for d in diags)})
    if first.field:
        info.metadata["field"] = first.field
    packed = any_pb2.Any()
    packed.Pack(info)
    st.details.append(packed)
    return st


def trailer(st: status_pb2.Status) -> tuple[str, bytes]:
    return (TRAILER, st.SerializeToString())


# The code of a refusal that names none itself, by method and status.
_DEFAULT_CODES: dict[tuple[str, grpc.StatusCode], str] = {
    ("Decide", grpc.StatusCode.INVALID_ARGUMENT): "E713",
    ("Decide", grpc.StatusCode.RESOURCE_EXHAUSTED): "E713",
    ("Explain", grpc.StatusCode.INVALID_ARGUMENT): "E713",
    ("Explain", grpc.StatusCode.RESOURCE_EXHAUSTED): "E713",
    ("RegisterInstance", grpc.StatusCode.INVALID_ARGUMENT): "E723",
    ("RegisterInstance", grpc.StatusCode.NOT_FOUND): "E720",
    ("RegisterInstance", grpc.StatusCode.FAILED_PRECONDITION): "E721",
    ("RegisterInstance", grpc.StatusCode.ALREADY_EXISTS): "E724",
    ("DeregisterInstance", grpc.StatusCode.NOT_FOUND): "E724",
}


def default_code(method: str, code: grpc.StatusCode) -> str | None:
    return _DEFAULT_CODES.get((method, code))
