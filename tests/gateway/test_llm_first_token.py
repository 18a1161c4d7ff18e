"""Streams whose contract asks for no TPOT bound, through the real gateway: the stream
supervisor holds the first token to its TTFT budget and then leaves the stream (no message
per chunk, `llm_routes.POOL_HTTP1_FIRST_CLUSTER`); the answer's end and tokens come from the
call's access-log entry, read by Envoy as the answer passed (`llm_routes.USAGE_LUA`). A
request that brings its own TPOT budget is still followed chunk by chunk."""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Iterator

import pytest
from llm_rig import LITE, LLM, REPO, LlmGateway, start_llm_gateway
from llm_support import make_tokenizer
from test_llm_gateway import chat, fake_stats, post, read_audit_actions, served_model, sse

TPOT_LINE = "tpot: <= 50 ms"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlmGateway]:
    contracts = tmp_path_factory.mktemp("contracts")
    text = (REPO / "policies" / "llm" / "tiny-llm.contract").read_text()
    assert TPOT_LINE in text, "policies/llm/tiny-llm.contract no longer declares its TPOT bound as this test expects"
    (contracts / "tiny-llm.contract").write_text(text.replace(TPOT_LINE, ""))
    gw = start_llm_gateway(tokenizer=make_tokenizer(tmp_path_factory.mktemp("tok")), contracts=(contracts,))
    yield gw
    gw.stop()


def _llm_record(gw: LlmGateway, did: str) -> dict[str, Any]:
    records = read_audit_actions(gw, did, "accounting", timeout=30.0)
    assert records, (did, gw.supervisor.counts, [(r.kind, r.detail) for r in gw.supervisor.records if r.decision_id == did])
    return records[0]


def test_a_stream_is_left_at_its_first_token_and_recorded_from_the_access_log(gateway: LlmGateway) -> None:
    left = gateway.supervisor.counts.get("left-at-first-token", 0)
    status, h, raw = post(gateway, "/v1/chat/completions", chat("one two three four", max_tokens=9, stream=True),
                          {"x-policyc-fake-gap-ms": "20"})
    assert status == 200
    events = sse(raw)
    assert events[-1] == "[DONE]" and sum(1 for e in events[:-1] if json.loads(e)["choices"]) == 9  # all of it, in order
    usage = next(json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage"))
    did = h["x-policyc-decision-id"]
    assert did in gateway.picks.first_token_only
    assert gateway.supervisor.counts.get("left-at-first-token", 0) == left + 1
    llm = _llm_record(gateway, did)["llm"]
    assert llm["completion_tokens"]["value"] == usage["completion_tokens"] == 9
    assert llm["prompt_tokens"]["value"] == usage["prompt_tokens"]
    for key in ("completion_tokens", "prompt_tokens"):
        assert llm[key]["source"] == "measured" and llm[key]["method"].startswith("envoy, as the answer passed"), llm[key]
    assert llm["ttft_seconds"]["source"] == "measured" and llm["ttft_seconds"]["value"] > 0
    # 8 gaps of 20 ms after the first token, over Envoy's last byte: a mean of at least the server's gap
    tpot = llm["tpot_seconds"]
    assert tpot["source"] == "measured" and "access log" in tpot["method"] and 0.015 <= tpot["value"] < 1.0, tpot
    assert "tpot_budget_seconds" not in llm or llm["tpot_budget_seconds"] is None


def test_its_in_flight_count_ends_with_the_answer(gateway: LlmGateway) -> None:
    """Not at the first token, where the supervisor left: at the call's access-log entry."""
    in_flight = gateway.picker.picker.in_flight_gpus
    assert in_flight is not None
    status, h, _ = post(gateway, "/v1/chat/completions", chat(max_tokens=20, stream=True), {"x-policyc-fake-gap-ms": "50"})
    assert status == 200
    did = h["x-policyc-decision-id"]
    gpu = gateway.picker.picker.recent[did].gpu_key
    deadline = time.monotonic() + 30
    while in_flight.count(gpu) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_flight.count(gpu) == 0 and in_flight.seconds(gpu) is not None
    assert did not in gateway.supervisor.pending


def test_the_first_token_is_still_held_to_its_ttft_budget(gateway: LlmGateway) -> None:
    status, h, raw = post(gateway, "/v1/chat/completions", chat(max_tokens=4, stream=True),
                          {"x-slo-ttft-ms": "300", "x-policyc-fake-ttft-ms": "10000"})
    assert status == 200 and h["x-envoy-attempt-count"] == "2", (status, h)
    assert served_model(gateway, h) == LITE
    events = sse(raw)
    assert events[-1] == "[DONE]" and sum(1 for e in events[:-1] if json.loads(e)["choices"]) == 4


def test_a_request_with_its_own_tpot_budget_is_followed_chunk_by_chunk(gateway: LlmGateway) -> None:
    cancelled = sum(s["cancelled"] for s in fake_stats(gateway, LLM))
    status, h, raw = post(gateway, "/v1/chat/completions", chat(max_tokens=6, stream=True),
                          {"x-slo-tpot-ms": "250", "x-policyc-fake-stall-after": "2", "x-policyc-fake-stall-ms": "3000"})
    assert status == 200
    assert h["x-policyc-decision-id"] not in gateway.picks.first_token_only
    events = sse(raw)
    assert json.loads(events[-2])["error"]["code"] == "tpot_exceeded"
    deadline = time.monotonic() + 10
    while sum(s["cancelled"] for s in fake_stats(gateway, LLM)) == cancelled and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sum(s["cancelled"] for s in fake_stats(gateway, LLM)) > cancelled


def test_a_non_streamed_answer_is_measured_by_the_supervisor(gateway: LlmGateway) -> None:
    status, h, raw = post(gateway, "/v1/chat/completions", chat("one two", max_tokens=5))
    assert status == 200
    did = h["x-policyc-decision-id"]
    assert did not in gateway.picks.first_token_only
    llm = _llm_record(gateway, did)["llm"]
    assert llm["completion_tokens"]["value"] == json.loads(raw)["usage"]["completion_tokens"] == 5
    assert llm["completion_tokens"]["method"].startswith("gateway:")



def test_a_client_that_leaves_after_the_first_token_cuts_the_answer_and_its_record_says_so(gateway: LlmGateway) -> None:
    """The supervisor has left the stream; Envoy still resets the upstream when the client goes,
    the model server stops, and the call's access-log entry (its reset flag) marks the record cut."""
    before = sum(s["cancelled"] for s in fake_stats(gateway, LLM))
    host, port = gateway.listen.split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    body = json.dumps(chat(max_tokens=200, stream=True)).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"x-policyc-fake-gap-ms: 50\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(65536)
    did = next(line.split(b":", 1)[1].strip().decode() for line in got.split(b"\r\n")
               if line.lower().startswith(b"x-policyc-decision-id:"))
    s.close()  # 3 of 200 tokens read: the client leaves
    deadline = time.monotonic() + 15
    while sum(x["cancelled"] for x in fake_stats(gateway, LLM)) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sum(x["cancelled"] for x in fake_stats(gateway, LLM)) > before, "the model server kept generating"
    assert did in gateway.picks.first_token_only
    record = _llm_record(gateway, did)
    assert "cut: its stream was reset" in record["detail"], record["detail"]
    completion = record["llm"]["completion_tokens"]
    assert completion is None or completion["value"] < 200  # what passed before the cut, if Envoy read a usage at all
