"""A refusal with many problems arrives as itself: a Decide with 64 bad headers once came
back as `RESOURCE_EXHAUSTED` ("received metadata size exceeds hard limit", 17 KB of
trailers against the client's 8 KiB) instead of its `INVALID_ARGUMENT`. A real gRPC client
with its default limits calls a real server; the refusal keeps its code, its readable
`google.rpc.Status` (the first problems in detail, the rest counted) and its
`policyc-problem` lines, all within `rich_status.TRAILER_BUDGET`."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from policyc.compiler.diagnostic import error
from policyc.server.proto import pb
from policyc.server.rich_status import MAX_MESSAGE, TRAILER_BUDGET, refusal_trailers, wire_size

LONG = "x" * 200  # a value the refusal echoes (cut to its 32-character preview or similar)

CASES = {
    # name: (headers, the status code, how many problems the refusal must count)
    "64-unknown-headers": ({f"X-Bogus-Header-{i:03d}": "1" for i in range(64)}, grpc.StatusCode.INVALID_ARGUMENT, 64),
    "64-bad-values": ({"X-SLO-Latency": "fast", **{f"X-Unknown-{i}": LONG for i in range(63)}},
                      grpc.StatusCode.INVALID_ARGUMENT, 64),
    "63-misspelt-headers": ({f"X-Data-Regoin{'x' * i}": "us-west" for i in range(63)}, grpc.StatusCode.INVALID_ARGUMENT, 63),
    "500-headers": ({f"X-H-{i}": "v" for i in range(500)}, grpc.StatusCode.INVALID_ARGUMENT, 1),
}


def _size(md: tuple[tuple[str, str | bytes], ...]) -> int:
    return sum(wire_size(k, v) for k, v in md)


@pytest.mark.parametrize("name", sorted(CASES))
def test_many_bad_headers_get_their_invalid_argument(name: str, stub) -> None:
    headers, code, problems = CASES[name]
    with pytest.raises(grpc.RpcError) as info:
        stub.Decide(pb.DecideRequest(headers=headers), timeout=20)
    e = info.value
    assert e.code() is code, f"{e.code()}: {e.details()}"
    md = tuple(e.trailing_metadata() or ())
    assert _size(md) <= TRAILER_BUDGET + 200  # grpc-status and the message besides ours
    st = rpc_status.from_call(e)  # the message and the Status agree
    assert st is not None and st.code == code.value[0]
    infos = [d for d in st.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert len(infos) == 1
    ei = error_details_pb2.ErrorInfo()
    infos[0].Unpack(ei)
    detailed = len(ei.metadata["codes"].split(","))
    assert detailed >= 1
    if problems > detailed:  # what is not detailed is counted
        assert int(ei.metadata["problems"]) == problems and int(ei.metadata["omitted"]) == problems - detailed
        lines = [v for k, v in md if k == "policyc-problem"]
        omitted = [int(v) for k, v in md if k == "policyc-problems-omitted"]
        assert omitted == [problems - len(lines)]


def test_the_budget_holds_whatever_the_problems_say() -> None:
    # 64 problems of 1,000 characters each, with non-ASCII and a long message: still fits
    diags = [error("E701", f"header `X-{i}`: " + "é→" * 500, field=f"X-{i}") for i in range(64)]
    message, md = refusal_trailers(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(d.message for d in diags),
                                   [d.message for d in diags], "X-0", diags, {"request_id": "r" * 2000})
    assert wire_size("grpc-message", message) <= MAX_MESSAGE + 80 and message.endswith("characters more cut)")
    assert wire_size("grpc-message", message) + _size(tuple(md)) <= TRAILER_BUDGET
    assert all(isinstance(v, bytes) or v.isascii() for _, v in md)


def test_a_short_refusal_is_sent_whole() -> None:
    diags = [error("E703", "header `X-SLO-Latency`: `5 GB/s` is a bandwidth, not a time", field="X-SLO-Latency"),
             error("E701", "header `X-Data-Regoin`: unknown header; did you mean `X-Data-Region`?", field="X-Data-Regoin")]
    message, md = refusal_trailers(grpc.StatusCode.INVALID_ARGUMENT, "two problems", [d.message for d in diags], None, diags)
    assert message == "two problems"
    assert [v for k, v in md if k == "policyc-problem"] == [d.message for d in diags]
    assert not any(k == "policyc-problems-omitted" for k, _ in md)
