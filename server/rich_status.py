"""A refusal as the standard rich gRPC error: a `google.rpc.Status` in the
`grpc-status-details-bin` trailer, which `grpc_status.rpc_status.from_call()` (and every
other gRPC stack's status helper) reads.

The details are the refusal's `Diagnostic`s, the one shape the compiler and the CLI use:
a `google.rpc.BadRequest` with one field violation per problem that names a field (a
request header, a registration field; its `reason` is the problem's policyc code from
`policyc.compiler.codes`), and a `google.rpc.ErrorInfo` whose `reason` is the first code.

The whole refusal must fit the client's trailing-metadata limit: every gRPC client takes
8 KiB of metadata by default (`grpc.max_metadata_size`) and refuses more, so an answer
with more (64 bad headers once made 17 KB) reached the caller as `RESOURCE_EXHAUSTED`
("received metadata size exceeds hard limit") instead of its `INVALID_ARGUMENT`.
`refusal_trailers` fits the message, the `policyc-problem` lines and the details into
`TRAILER_BUDGET`: the first problems in full, then a count of the rest (`ErrorInfo`
metadata `problems` and `omitted`, and a `policyc-problems-omitted` line).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from policyc.compiler.diagnostic import Diagnostic

DOMAIN = "policyc"
TRAILER = "grpc-status-details-bin"
MAX_DETAILS = 32  # problems sent in detail; the message still counts all of them
MAX_TEXT = 1000
MAX_MESSAGE = 1024  # bytes of the status message on the wire (it travels twice: grpc-message and the Status)
MIN_TEXT = 80  # a problem's description is never cut shorter than this to make room
# Bytes of trailing metadata a refusal may use: under the 8 KiB a gRPC client accepts by
# default, leaving room for :status, content-type and grpc-status.
TRAILER_BUDGET = 6 * 1024
ENTRY_OVERHEAD = 32  # HTTP/2 counts 32 bytes per header besides its name and value (RFC 7541, 4.1)


def rich_status(code: grpc.StatusCode, message: str, diagnostics: Iterable[Diagnostic],
                info: dict[str, str] | None = None, *, shown: int = MAX_DETAILS, text: int = MAX_TEXT) -> status_pb2.Status:
    """`message` must be the status details the call is aborted with, word for word
    (`from_call` checks that the two agree). One `ErrorInfo`, for the first problem (its
    code is the `reason`; `codes` in its metadata lists the code of each problem sent in
    detail, `problems` how many there were and `omitted` how many are not detailed), and
    one `BadRequest` whose violations each carry their own code as `reason`. `info`: more
    ErrorInfo metadata (an unknown outcome says `outcome` and `request_id` there).
    `shown`: at most this many problems in detail; `text`: characters per description."""
    extra = {k[:64]: v[:MAX_TEXT] for k, v in (info or {}).items()}
    every = list(diagnostics)
    diags = every[:max(1, min(shown, MAX_DETAILS))]
    st = status_pb2.Status(code=code.value[0], message=message)
    if not diags:
        return st
    violations = [error_details_pb2.BadRequest.FieldViolation(field=d.field[:256], description=d.message[:text], reason=d.code)
                  for d in diags if d.field]
    if violations:
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.BadRequest(field_violations=violations))
        st.details.append(packed)
    first = diags[0]
    error_info = error_details_pb2.ErrorInfo(reason=first.code, domain=DOMAIN,
                                             metadata={"codes": ",".join(d.code for d in diags)})
    if len(every) > len(diags):
        error_info.metadata["problems"] = str(len(every))
        error_info.metadata["omitted"] = str(len(every) - len(diags))
    if first.field:
        error_info.metadata["field"] = first.field[:256]
    error_info.metadata.update(extra)
    packed = any_pb2.Any()
    packed.Pack(error_info)
    st.details.append(packed)
    return st


def trailer(st: status_pb2.Status) -> tuple[str, bytes]:
    return (TRAILER, st.SerializeToString())


def printable(text: str) -> str:
    """Metadata values must be printable ASCII; keep the text readable anyway (a NUL or a
    line break echoed from the input would make the whole status INTERNAL)."""
    text = text.replace("\u2026", "...").replace("\u2192", "->").encode("ascii", "replace").decode()
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def _char_size(c: str) -> int:
    return sum(1 if 0x20 <= b <= 0x7E and b != 0x25 else 3 for b in c.encode("utf-8", "replace"))


def wire_size(name: str, value: str | bytes) -> int:
    """What one metadata entry counts against the client's limit: binary values travel
    base64-encoded, a status message percent-encoded (a byte outside printable ASCII or a
    `%` takes three)."""
    if isinstance(value, bytes):
        return len(name) + len(base64.b64encode(value)) + ENTRY_OVERHEAD
    return len(name) + sum(_char_size(c) for c in value) + ENTRY_OVERHEAD


def cap_message(message: str, limit: int = MAX_MESSAGE) -> str:
    """The status message cut to at most `limit` bytes as it travels (percent-encoded), the
    cut said."""
    size = 0
    for i, c in enumerate(message):
        size += _char_size(c)
        if size > limit:
            return f"{message[:i]}... ({len(message) - i} characters more cut)"
    return message


def refusal_trailers(code: grpc.StatusCode, message: str, problems: Sequence[str], field: str | None,
                     diagnostics: Sequence[Diagnostic], info: dict[str, str] | None = None,
                     budget: int = TRAILER_BUDGET) -> tuple[str, list[tuple[str, str | bytes]]]:
    """The status message and trailing metadata of a refusal, together within `budget`
    bytes: the message (cut at `MAX_MESSAGE` bytes), one `policyc-problem` line per problem, the
    `policyc-field`, and the `google.rpc.Status` of `diagnostics`. When they do not fit, the
    number of problems detailed (lines and violations) and the length of each description
    are halved until they do; what is left out is counted (`policyc-problems-omitted`, and
    `problems` / `omitted` in the ErrorInfo), never silently dropped."""
    message = cap_message(message)
    lines = [printable(p[:MAX_TEXT]) for p in problems[:MAX_DETAILS]]
    shown, text = MAX_DETAILS, MAX_TEXT
    used = wire_size("grpc-message", message)
    while True:
        kept = lines[:shown]
        md: list[tuple[str, str | bytes]] = [("policyc-problem", line[:text]) for line in kept]
        if len(problems) > len(kept):
            md.append(("policyc-problems-omitted", str(len(problems) - len(kept))))
        if field:
            md.append(("policyc-field", printable(field[:256])))
        if diagnostics:
            md.append(trailer(rich_status(code, message, diagnostics, info, shown=shown, text=text)))
        size = used + sum(wire_size(k, v) for k, v in md)
        if size <= budget or (shown <= 1 and text <= MIN_TEXT):
            return message, md
        shown, text = max(1, shown // 2), max(MIN_TEXT, text // 2)


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
