"""LLM traffic through the real gateway (Envoy, the picker reading bodies with the model's
own tokenizer, the stream supervisor) to the session's two real vLLM servers (HTTP/1.1):
chat and completions routed by the body, a stream whose first token arrives long before
its last, an HTTP/2 client, prompt tokens counted as vLLM counts them, the audit's tokens
equal to vLLM's `usage`, a TPOT stall ending the stream (vLLM stops generating), a client
that leaves cancelling generation. The TTFT break and retry, and every bad body, are in
tests/gateway/test_llm_gateway.py against a test server whose first token can be held."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from vllm_fleet import VllmFleet, held_engines

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from llm_rig import LlmGateway, start_llm_gateway  # noqa: E402

from policyc.audit.query import AuditReader  # noqa: E402


@pytest.fixture(scope="module")
def gw(vllm_servers: VllmFleet) -> Iterator[LlmGateway]:
    g = start_llm_gateway(tokenizer=vllm_servers.model_dir, contracts=(vllm_servers.contract_path,),
                          served=[(vllm_servers.model, e) for e in vllm_servers.endpoints])
    yield g
    g.stop()


def post(gw: LlmGateway, path: str, body: dict[str, Any], headers: dict[str, str] | None = None,
         ) -> tuple[int, dict[str, str], bytes]:
    host, port = gw.listen.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        c.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json", **(headers or {})})
        r = c.getresponse()
        try:
            data = r.read()
        except http.client.IncompleteRead as e:  # a stream the gateway reset after its last event (TPOT)
            data = e.partial
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def events_of(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


def accounting(gw: LlmGateway, decision_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """The LLM figures of the call's accounting record, read back from the audit file."""
    deadline = time.monotonic() + timeout
    while True:
        with AuditReader.open(gw.workdir / "audit.db") as reader:
            found = [json.loads(e.record.model_dump_json()) for e in reader.actions_for(decision_id)
                     if e.record.kind == "accounting" and getattr(e.record, "llm", None) is not None]
        if found:
            return found[0]["llm"]
        if time.monotonic() > deadline:
            pytest.fail(f"no accounting record for {decision_id}")
        time.sleep(0.1)


def generated(endpoint: str) -> float:
    """vLLM's own count of the tokens it generated (its /metrics)."""
    c = http.client.HTTPConnection(*endpoint.split(":"), timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return sum(float(m) for m in re.findall(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def test_chat_and_completions_routed_to_vllm_with_tokens_as_vllm_counts(gw: LlmGateway, vllm_servers: VllmFleet) -> None:
    model = vllm_servers.model
    status, h, raw = post(gw, "/v1/chat/completions",
                          {"model": model, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8})
    assert status == 200, raw[:300]
    usage = json.loads(raw)["usage"]
    figures = accounting(gw, h["x-policyc-decision-id"])
    assert figures["prompt_tokens"]["value"] == usage["prompt_tokens"] and figures["prompt_tokens"]["source"] == "measured"
    assert figures["completion_tokens"]["value"] == usage["completion_tokens"]
    assert figures["ttft_seconds"]["source"] == "measured" and figures["ttft_budget_seconds"]["source"] == "estimated"
    prompt = "def parse(text):\n    return [line.strip() for line in text.splitlines() if line]\n"
    status, h, raw = post(gw, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4})
    assert status == 200, raw[:300]
    read = gw.picks.recent[h["x-policyc-decision-id"]]
    assert read.prompt.counted and read.prompt.tokens == json.loads(raw)["usage"]["prompt_tokens"]


def test_a_stream_passes_through_token_by_token(gw: LlmGateway, vllm_servers: VllmFleet) -> None:
    """The first tokens reach the client while vLLM has not yet made the rest. vLLM makes
    hundreds of tokens in ~0.1 s, and a loaded machine can hand them to the client in one
    read, so a count of chunks or their spread in time proves nothing there. Instead the
    engines are held, stepped until vLLM has made its first tokens, and kept held: the client
    must get tokens while vLLM's own count stands below the 900 asked for. A gateway that
    buffered the answer would hand the client nothing until the engines ran again."""
    def total() -> float:
        return sum(generated(e) for e in vllm_servers.endpoints)

    host, port = gw.listen.split(":")
    body = {"model": vllm_servers.model, "messages": [{"role": "user", "content": "Go on."}], "max_tokens": 900,
            "ignore_eos": True, "stream": True}
    got: dict[str, Any] = {"events": [], "status": None}

    def client() -> None:
        c = http.client.HTTPConnection(host, int(port), timeout=180)
        c.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                  {"content-type": "application/json", "x-slo-tpot-ms": "120000", "x-slo-ttft-ms": "120000"})
        r = c.getresponse()
        got["status"], got["type"], got["did"] = r.status, r.getheader("content-type", ""), r.getheader("x-policyc-decision-id")
        while True:
            line = r.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                got["events"].append(line[6:].strip().decode())
        c.close()

    def tokens_reached_client() -> bool:
        return any(e != "[DONE]" and json.loads(e).get("choices") for e in list(got["events"]))

    for _ in range(3):  # an attempt whose first engine step already made all 900 tokens proves nothing: another one
        got.update(events=[], status=None)
        before = total()
        reader = threading.Thread(target=client, daemon=True)
        with held_engines(vllm_servers) as hold:
            reader.start()
            hold.step_until(lambda b=before: total() > b)  # vLLM made its first tokens; held from here on
            made = hold.settled(total) - before
            if made < 900:
                assert _until(tokens_reached_client, 60), f"no token reached the client while vLLM was held ({made:.0f} made)"
                assert total() - before == made  # nothing was made meanwhile: the client's tokens came from the stream
        reader.join(120)
        if made < 900:
            break
    events = got["events"]
    assert got["status"] == 200 and got["type"].startswith("text/event-stream")
    assert 0 < made < 900, made
    assert events[-1] == "[DONE]"
    assert sum(1 for e in events[:-1] if json.loads(e).get("choices")) >= 2  # more than one chunk: streamed
    usage = next(json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage"))
    assert accounting(gw, got["did"] or "")["completion_tokens"]["value"] == usage["completion_tokens"] == 900


def test_an_http2_client_to_an_http1_vllm(gw: LlmGateway, vllm_servers: VllmFleet) -> None:
    out = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "-D", "-", "-H", "content-type: application/json",
                          "--data", json.dumps({"model": vllm_servers.model, "prompt": "x = ", "max_tokens": 3}),
                          f"http://{gw.listen}/v1/completions"], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("HTTP/2 200"), (out.stdout[:300], out.stderr)
    assert '"completion_tokens":3' in out.stdout.replace(" ", "")


def _upstream_resets(gw: LlmGateway) -> float:
    """Envoy's count of requests to the HTTP/1.1 pool it reset (each closes its connection to vLLM)."""
    from policyc.gateway.llm_routes import POOL_HTTP1_CLUSTER

    prefix = f"cluster.{POOL_HTTP1_CLUSTER}."
    stats = gw.envoy.stats(prefix)
    return sum(v for k, v in stats.items() if k.removeprefix(prefix) in ("upstream_rq_tx_reset", "upstream_cx_destroy_with_active_rq"))


def _until(what: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _whole(raw: bytes) -> bool:
    """The stream ended as vLLM ends one it finished: its last event before [DONE] carries no error."""
    events = events_of(raw)
    return len(events) >= 2 and events[-1] == "[DONE]" and "error" not in json.loads(events[-2])


# Held: the engines stay stopped after vLLM's API server saw its connection closed and queued the abort; the
# engine core takes its queue before its next step. Unheld, vLLM would make the 900 tokens in ~0.3 s, on a
# loaded machine before the gateway had passed the first (seen: 900 made, the stream ended after them).
ABORT_SETTLE_S = 3.0


def test_a_tpot_stall_ends_a_vllm_stream_and_vllm_stops(gw: LlmGateway, vllm_servers: VllmFleet) -> None:
    """vLLM's engines are held once they have made the stream's first tokens: a real stall. The
    supervisor ends the stream at its TPOT budget (an error event, [DONE]) and Envoy resets the
    upstream request; once the engines run again, vLLM makes no more of its 900 tokens."""
    def total() -> float:
        return sum(generated(e) for e in vllm_servers.endpoints)

    body = {"model": vllm_servers.model, "messages": [{"role": "user", "content": "Go on."}],
            "max_tokens": 900, "ignore_eos": True, "stream": True}
    headers = {"x-slo-tpot-ms": "300", "x-slo-ttft-ms": "60000"}  # a loaded machine's first token: not this test's
    for _ in range(3):  # an attempt whose first step already made all 900 tokens had no stall to break: another one
        before = total()
        answer: list[tuple[int, dict[str, str], bytes]] = []
        with held_engines(vllm_servers) as hold:
            resets = _upstream_resets(gw)
            client = threading.Thread(target=lambda a=answer: a.append(post(gw, "/v1/chat/completions", body, headers)))
            client.start()
            hold.step_until(lambda b=before: total() > b)
            made = hold.settled(total) - before
            client.join(120)  # the stream ends while the engines are held: the gateway broke the stall
            assert answer and not client.is_alive()
            if made >= 900 or _whole(answer[0][2]):  # the engines outran the hold: no stall to break
                made = 900.0
                continue
            _until(lambda r=resets: _upstream_resets(gw) > r, 20)  # Envoy's count of it, when it keeps one: then the abort's
            time.sleep(ABORT_SETTLE_S)  # time (the claim is vLLM's count below, the reset's only evidence that counts)
        if made < 900:
            break
    status, h, raw = answer[0]
    assert status == 200
    events = events_of(raw)
    seen = gw.supervisor.evidence.get(h["x-policyc-decision-id"], [])
    why = [(e.chunks, e.events, max(e.gaps, default=0.0), e.usage) for e in seen], gw.supervisor.counts, events[-3:]
    assert events[-1] == "[DONE]" and "error" in json.loads(events[-2]), why
    assert json.loads(events[-2])["error"]["code"] == "tpot_exceeded"
    time.sleep(2.0)
    print(f"vLLM made {made:.0f} tokens before the hold, {total() - before:.0f} in all")
    assert made < 900 and total() - before < 900, (made, total() - before)  # generation stopped with the stream


def test_a_client_that_leaves_cancels_generation(gw: LlmGateway, vllm_servers: VllmFleet) -> None:
    """The client closes its connection once the answer has begun, while vLLM's engines are held
    with the first tokens made: once they run again vLLM makes no more of its 900 tokens."""
    def total() -> float:
        return sum(generated(e) for e in vllm_servers.endpoints)

    host, port = gw.listen.split(":")
    body = json.dumps({"model": vllm_servers.model, "messages": [{"role": "user", "content": "Go on."}],
                       "max_tokens": 900, "ignore_eos": True, "stream": True}).encode()
    for _ in range(3):  # an attempt whose first engine step already made all 900 tokens has nothing to cancel: another one
        before = total()
        with held_engines(vllm_servers) as hold:
            resets = _upstream_resets(gw)
            s = socket.create_connection((host, int(port)), timeout=60)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"x-slo-tpot-ms: 60000\r\nx-slo-ttft-ms: 60000\r\n"
                      b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            hold.step_until(lambda b=before: total() > b)
            made = hold.settled(total) - before
            got = b""
            while b"data: " not in got:  # the answer has begun at the client
                chunk = s.recv(65536)
                assert chunk, got
                got += chunk
            s.close()  # the client leaves
            if made < 900:
                _until(lambda r=resets: _upstream_resets(gw) > r, 20)  # Envoy's count of it, when it keeps one: then
                time.sleep(ABORT_SETTLE_S)  # the abort's time (the claim is vLLM's count below, the reset's only evidence)
        if made < 900:
            break
    time.sleep(2.0)
    print(f"vLLM made {made:.0f} tokens before the hold, {total() - before:.0f} in all")
    assert made < 900 and total() - before < 900, (made, total() - before)


def test_a_first_token_later_than_its_ttft_budget_is_reset_before_the_answer_begins(gw: LlmGateway,
                                                                                    vllm_servers: VllmFleet) -> None:
    """vLLM sends its headers before its first token; the supervisor holds them, so Envoy's
    per-try timeout (the TTFT budget, 1 ms here: no first token comes that fast) still
    resets the attempt before anything reached the client. This contract names no backup,
    so the reset ends the request (504), and Envoy counted the per-try timeout."""
    from policyc.gateway.llm_routes import POOL_HTTP1_CLUSTER

    stat = f"cluster.{POOL_HTTP1_CLUSTER}.upstream_rq_per_try_timeout"
    before = gw.envoy.stats(stat).get(stat, 0)
    status, h, raw = post(gw, "/v1/chat/completions",
                          {"model": vllm_servers.model, "messages": [{"role": "user", "content": "Go on."}],
                           "max_tokens": 50, "stream": True}, {"x-slo-ttft-ms": "1"})
    assert status == 504 and b"data:" not in raw, (status, raw[:200])
    assert "per_try_timeout" in h.get("x-policyc-reason", "") or b"upstream request timeout" in raw, h
    assert gw.envoy.stats(stat).get(stat, 0) == before + 1
