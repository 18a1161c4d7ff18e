"""A call's accounting record built as its stored bytes (`call_accounting_body`, what the
gateway's access-log receiver hands the server bridge) is byte for byte the pydantic
record's `model_dump_json(exclude_none=True)`, for records like the gateway's and for
random ones (any text, tiny and huge floats, compute time absent); it refuses what the
record refuses; and stored through the bridge it is what `submit_action` stores, in a log
that verifies."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyc.audit.accounting import call_accounting, call_accounting_body
from policyc.audit.accounting_wire import accounting_json
from policyc.audit.draft_encoder import FigureWire
from policyc.audit.errors import AuditWriteError
from policyc.audit.log import AuditLog
from policyc.audit.verify import verify
from policyc.compiler.pipeline import compile_paths
from policyc.gateway.access_log import Attempt, Call, accounting_body, accounting_record
from policyc.server.audit_bridge import AuditBridge


def _pydantic(**kw: object) -> bytes:
    return call_accounting(**kw).model_dump_json(exclude_none=True).encode()  # type: ignore[arg-type]


GATEWAY_LIKE = dict(decision_id="887b87064b93c69d00000000a8ff2435", time=1796135723.832867, network_bytes=5115.0,
                    network_method="envoy grpc access log: upstream wire bytes sent + received, every attempt",
                    compute_seconds=0.000902, compute_method="model server: onnxruntime run time", target="127.0.0.1:42131",
                    detail='{"attempts":[{"host":"127.0.0.1:42131","sent":430}],"gpu_seconds":"absent: no GPU"}')

texts = st.text(max_size=40)  # any code point: escapes, non-ASCII, control characters, lone surrogates
floats = st.one_of(st.floats(min_value=0, max_value=1e300, allow_nan=False), st.sampled_from([0.0, 1e-7, 1e-5, 9.99e15, 1e16, 3e17]))


def test_the_gateways_record_is_the_same_bytes() -> None:
    assert call_accounting_body(**GATEWAY_LIKE) == _pydantic(**GATEWAY_LIKE)  # type: ignore[arg-type]
    g = GATEWAY_LIKE
    fast = accounting_json(g["decision_id"], g["time"], g["target"], g["detail"],  # type: ignore[arg-type]
                           FigureWire(value=g["network_bytes"], source="measured", method=g["network_method"]),  # type: ignore[arg-type]
                           FigureWire(value=g["compute_seconds"], source="measured", method=g["compute_method"]))  # type: ignore[arg-type]
    assert fast == _pydantic(**GATEWAY_LIKE)  # the structs wrote it, not the pydantic fallback
    no_compute = {**GATEWAY_LIKE, "compute_seconds": None}
    assert call_accounting_body(**no_compute) == _pydantic(**no_compute)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(did=texts, t=st.floats(min_value=-1e17, max_value=1e17, allow_nan=False), net=floats,
       compute=st.one_of(st.none(), floats), method=texts, target=texts, detail=texts)
def test_random_records_are_the_same_bytes_or_the_same_refusal(did: str, t: float, net: float, compute: float | None,
                                                                method: str, target: str, detail: str) -> None:
    kw = dict(decision_id=did, time=t, network_bytes=net, network_method=method, compute_seconds=compute,
              compute_method=method[::-1], target=target, detail=detail)
    try:
        expected = _pydantic(**kw)
    except Exception as e:  # noqa: BLE001 - whatever the models refuse, the fast path refuses as well
        with pytest.raises(type(e)):
            call_accounting_body(**kw)  # type: ignore[arg-type]
        return
    assert call_accounting_body(**kw) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [dict(network_bytes=-1.0), dict(compute_seconds=-0.001), dict(network_bytes=float("nan"))])
def test_what_the_record_refuses_is_refused_with_the_same_message(bad: dict[str, float]) -> None:
    kw = {**GATEWAY_LIKE, **bad}
    with pytest.raises(ValueError, match="cannot be negative"):
        call_accounting(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot be negative"):
        call_accounting_body(**kw)  # type: ignore[arg-type]


def _call(i: int) -> tuple[Call, list[Attempt]]:
    call = Call(decision_id=f"{i:032x}", start=1.7e9 + i / 7, received=310 + i, sent=260, duration=0.0045, first_byte=0.004,
                attempts=2 if i % 2 else 1, grpc_status="0", tls=bool(i % 3), upstream_host="127.0.0.1:4100", instance="inst-é")
    attempts = [Attempt(host=f"127.0.0.1:41{k:02d}", instance="inst-1", sent=300, received=250 + k, duration=0.004 + k / 1e6,
                        first_byte=None if k else 0.0039, status=200 if k == call.attempts - 1 else 0, grpc_status="0",
                        compute_seconds=0.0008 if k == call.attempts - 1 else None,
                        flags="" if k == call.attempts - 1 else "upstream_reset") for k in range(call.attempts)]
    return call, attempts


def test_the_receivers_body_is_its_records_bytes() -> None:
    for i in range(20):
        call, attempts = _call(i)
        assert accounting_body(call, attempts) == accounting_record(call, attempts).model_dump_json(exclude_none=True).encode()


def test_bodies_through_the_bridge_are_what_submit_action_stores(tmp_path: Path) -> None:
    bundle = compile_paths(["policies"], analyse=False).bundle
    assert bundle is not None
    calls = [_call(i) for i in range(12)]
    with AuditLog.open(tmp_path / "direct.db") as log:
        for call, attempts in calls:
            log.submit_action(accounting_record(call, attempts))
    with AuditLog.open(tmp_path / "bridge.db") as log:
        bridge = AuditBridge(log, bundle)
        for call, attempts in calls:
            bridge.accounting_body(accounting_body(call, attempts))
        with pytest.raises(TypeError, match="bytes"):
            bridge.accounting_body(accounting_record(*calls[0]))  # type: ignore[arg-type]
        bridge.close()
        assert bridge.failures == 0
        with pytest.raises(AuditWriteError, match="closed"):
            bridge.accounting_body(accounting_body(*calls[0]))

    def bodies(path: Path) -> list[bytes]:
        with sqlite3.connect(path) as c:
            return [r[0] for r in c.execute("SELECT body FROM entries ORDER BY seq") if b'"kind":"accounting"' in r[0]]

    assert bodies(tmp_path / "bridge.db") == bodies(tmp_path / "direct.db") and len(bodies(tmp_path / "bridge.db")) == 12
    report = verify(tmp_path / "bridge.db")
    assert report.ok, report
