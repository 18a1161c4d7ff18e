"""policyc's access-log receiver when the router logs broken attempts only (what `policyc
gateway` configures): the answering attempt is read from the call's own entry, a broken
attempt still comes from the router's log, and a call whose last attempt broke is not given
a second copy of it. The entries are the protobufs Envoy sends (field values as a real Envoy
1.40 wrote them for a call broken by its per-try timeout and answered by the backup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2 as al

from policyc.audit.records import ActionRecord
from policyc.gateway.access_log import DOWNSTREAM_LOG, UPSTREAM_LOG, AccessLogReceiver
from policyc.gateway.bootstrap import DECISION_HEADER, GatewaySpec, build_bootstrap

DID = "d" * 32
PRIMARY, BACKUP = "127.0.0.1:8001", "127.0.0.1:8003"


def _common(c: al.AccessLogCommon, host: str, sent: int, received: int, tx_ms: float, rx_ms: float, last_ms: float) -> None:
    c.start_time.FromNanoseconds(1_796_131_806_000_000_000)
    sa = c.upstream_remote_address.socket_address
    sa.address, sa.port_value = host.split(":")[0], int(host.split(":")[1])
    c.upstream_wire_bytes_sent, c.upstream_wire_bytes_received = sent, received
    c.time_to_first_upstream_tx_byte.FromNanoseconds(int(tx_ms * 1e6))
    if rx_ms:
        c.time_to_first_upstream_rx_byte.FromNanoseconds(int(rx_ms * 1e6))
        c.time_to_last_upstream_rx_byte.FromNanoseconds(int(last_ms * 1e6))
    c.duration.FromNanoseconds(int(max(last_ms, tx_ms) * 1e6) + 100_000)


def call_entry(attempts: int, timed_out: bool = False) -> al.HTTPAccessLogEntry:
    e = al.HTTPAccessLogEntry()
    e.request.request_headers[DECISION_HEADER] = DID
    if timed_out:  # the last attempt broke too: no answer, the call's flags say so
        _common(e.common_properties, BACKUP, 722, 0, 45.0, 0, 0)
        e.common_properties.response_flags.upstream_request_timeout = True
        e.response.response_code.value = 504
    else:
        _common(e.common_properties, BACKUP, 1721, 66175, 55.18, 60.52, 61.45)
        e.response.response_code.value = 200
        e.response.response_headers.update({"x-policyc-compute-us": "915", "x-policyc-instance": "lite@h/g2"})
        e.response.response_trailers["grpc-status"] = "0"
    e.common_properties.upstream_request_attempt_count = attempts
    return e


def broken_entry(host: str = PRIMARY) -> al.HTTPAccessLogEntry:
    e = al.HTTPAccessLogEntry()
    e.request.request_headers[DECISION_HEADER] = DID
    _common(e.common_properties, host, 722, 0, 0.1, 0, 0)
    e.common_properties.duration.FromNanoseconds(43_672_856)
    e.common_properties.response_flags.upstream_request_timeout = True
    return e


def receiver() -> tuple[AccessLogReceiver, list[ActionRecord]]:
    got: list[ActionRecord] = []
    return AccessLogReceiver(got.append, every_attempt=False), got


def test_an_unbroken_call_is_recorded_from_its_one_entry() -> None:
    r, got = receiver()
    r._take(DOWNSTREAM_LOG, call_entry(1))
    [rec] = got
    detail = json.loads(rec.detail)
    [a] = detail["attempts"]
    assert (a["host"], a["sent"], a["received"], a["status"], a["grpc_status"]) == (BACKUP, 1721, 66175, 200, "0")
    assert a["instance"] == "lite@h/g2" and a["compute_seconds"] == 915e-6 and a["flags"] == ""
    assert abs(a["first_byte"] - 0.00534) < 1e-5 and abs(a["duration"] - 0.00627) < 1e-5  # from its first byte sent
    assert detail["attempts_missing"] == 0 and rec.resources.network_bytes.value == 1721 + 66175  # type: ignore[union-attr]
    assert r.sent_by_host == {BACKUP: 1721} and r.pending() == 0


def test_a_body_sink_gets_each_records_stored_bytes() -> None:
    bodies: list[bytes] = []
    r, got = receiver()
    fast = AccessLogReceiver(None, every_attempt=False, body_sink=bodies.append)
    for rec in (r, fast):
        rec._take(DOWNSTREAM_LOG, call_entry(2))
        rec._take(UPSTREAM_LOG, broken_entry())
    [record], [body] = got, bodies
    assert body == record.model_dump_json(exclude_none=True).encode() and fast.counts.recorded == 1 and fast.records
    with pytest.raises(ValueError, match="not both"):
        AccessLogReceiver(got.append, body_sink=bodies.append)


def test_a_broken_and_retried_call_has_the_routers_broken_attempt_and_the_calls_answer() -> None:
    for order in ("call first", "attempt first"):
        r, got = receiver()
        entries = [(DOWNSTREAM_LOG, call_entry(2)), (UPSTREAM_LOG, broken_entry())]
        for i, (name, e) in enumerate(entries if order == "call first" else entries[::-1]):
            r._take(name, e)
            assert r.pending() == (1 if i == 0 else 0), order  # the first half waits for the other, then nothing is kept
        [rec] = got
        detail = json.loads(rec.detail)
        broken, answer = detail["attempts"]
        assert broken["host"] == PRIMARY and broken["flags"] == "upstream_request_timeout" and broken["compute_seconds"] is None
        assert answer["host"] == BACKUP and answer["sent"] == 1721 and answer["compute_seconds"] == 915e-6
        assert detail["attempts_expected"] == 2 and detail["attempts_missing"] == 0
        assert rec.resources.network_bytes.value == 722 + 1721 + 66175, order  # type: ignore[union-attr]
        assert r.sent_by_host == {PRIMARY: 722, BACKUP: 1721}


def test_a_call_whose_last_attempt_broke_waits_for_it_and_gets_no_second_copy() -> None:
    r, got = receiver()
    r._take(DOWNSTREAM_LOG, call_entry(2, timed_out=True))
    r._take(UPSTREAM_LOG, broken_entry())
    assert not got  # the router logged the last attempt too: it waits for that one
    r._take(UPSTREAM_LOG, broken_entry(BACKUP))
    [rec] = got
    attempts = json.loads(rec.detail)["attempts"]
    assert [a["host"] for a in attempts] == [PRIMARY, BACKUP] and all(a["status"] == 0 for a in attempts)


def test_the_routers_log_is_filtered_to_broken_attempts_without_log_every_attempt(tmp_path: Path) -> None:
    def logs(spec: GatewaySpec) -> tuple[dict, dict]:  # type: ignore[type-arg]
        hcm = build_bootstrap(spec)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        return hcm["access_log"][0], hcm["http_filters"][-1]["typed_config"]["upstream_log"][0]

    base = dict(picker="127.0.0.1:9002", endpoints=(PRIMARY,), access_log_cluster="127.0.0.1:9003", breaks_from_access_log=True)
    call, attempt = logs(GatewaySpec(**base, log_every_attempt=False))  # type: ignore[arg-type]
    assert "filter" not in call  # every call
    assert attempt["filter"] == {"response_flag_filter": {"flags": ["UT", "UR", "UC"]}}
    call, attempt = logs(GatewaySpec(**base))  # type: ignore[arg-type]
    assert "filter" not in call and "filter" not in attempt  # a user's sink: every attempt
