"""LLM traffic through the real gateway (Envoy, the picker reading bodies, OpenAI-compatible
HTTP/1.1 model servers as real processes): routed by the model in the body, streamed as the
server writes, from HTTP/1.1 and HTTP/2 clients, every bad body refused with its status and
reason, a rule on `request.prompt_tokens`. The same behaviours on real vLLM: tests/llm."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from llm_rig import LITE, LLM, LlmGateway, start_llm_gateway
from llm_support import make_tokenizer

from policyc.placer.signals.gateway_in_flight import ALPHA

MAX_BODY = 256 * 1024
BODY_TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def llm_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlmGateway]:
    tok = make_tokenizer(tmp_path_factory.mktemp("tok"))
    gw = start_llm_gateway(tokenizer=tok, max_body_bytes=MAX_BODY, body_timeout_ms=BODY_TIMEOUT_MS)
    yield gw
    gw.stop()


def post(gw: LlmGateway, path: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None,
         ) -> tuple[int, dict[str, str], bytes]:
    host, port = gw.listen.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        c.request("POST", path, raw, {"content-type": "application/json", **(headers or {})})
        r = c.getresponse()
        try:
            data = r.read()
        except http.client.IncompleteRead as e:  # a stream the gateway reset after its last event (TPOT)
            data = e.partial
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def chat(content: str = "hello there", **kw: Any) -> dict[str, Any]:
    return {"model": LLM, "messages": [{"role": "user", "content": content}], **kw}


def served_model(gw: LlmGateway, headers: dict[str, str]) -> str:
    iid = headers["x-policyc-instance"]
    return next(f.model for f in gw.fakes if f.instance_id == iid)


def test_chat_and_completions_routed_by_the_body(llm_gateway: LlmGateway) -> None:
    for model in (LLM, LITE):
        status, h, body = post(llm_gateway, "/v1/chat/completions", {**chat(max_tokens=4), "model": model})
        assert status == 200, body
        assert served_model(llm_gateway, h) == model
        out = json.loads(body)
        assert out["usage"]["completion_tokens"] == 4 and out["choices"][0]["message"]["content"]
        did = h["x-policyc-decision-id"]
        read = llm_gateway.picks.recent[did]
        assert read.model == model and read.max_tokens == 4 and read.prompt.counted and read.prompt.tokens > 0
    status, h, body = post(llm_gateway, "/v1/completions", {"model": LITE, "prompt": "def f(x):", "max_tokens": 3})
    assert status == 200 and served_model(llm_gateway, h) == LITE
    assert json.loads(body)["choices"][0]["text"].split() == ["tok0", "tok1", "tok2"]


def test_model_from_x_model_header(llm_gateway: LlmGateway) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, h, _ = post(llm_gateway, "/v1/chat/completions", body, {"x-model": LITE})
    assert status == 200 and served_model(llm_gateway, h) == LITE


def test_stream_passes_through_as_the_server_writes(llm_gateway: LlmGateway) -> None:
    """5 tokens 400 ms apart: the first event reaches the client well before the last is made."""
    host, port = llm_gateway.listen.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("POST", "/v1/chat/completions", json.dumps(chat(max_tokens=5, stream=True)).encode(),
              {"content-type": "application/json", "x-policyc-fake-gap-ms": "400", "x-slo-tpot-ms": "5000"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("content-type") == "text/event-stream"
    events: list[tuple[float, str]] = []
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append((time.monotonic(), line[6:].strip().decode()))
    c.close()
    tokens = [e for e in events if e[1] != "[DONE]" and json.loads(e[1])["choices"]]
    assert len(tokens) == 5
    assert tokens[-1][0] - tokens[0][0] >= 1.2  # 4 gaps of 400 ms: the first came as it was written
    usage = [json.loads(e[1]) for e in events if e[1] != "[DONE]" and not json.loads(e[1])["choices"]]
    assert usage and usage[0]["usage"]["completion_tokens"] == 5  # the gateway asked for usage
    assert events[-1][1] == "[DONE]"
    seen = []
    for f in llm_gateway.fakes:
        s = http.client.HTTPConnection("127.0.0.1", f.port, timeout=10)
        s.request("GET", "/fake/stats")
        seen += json.loads(s.getresponse().read())["requests"]
        s.close()
    streamed = [q["body"] for q in seen if q["body"].get("stream")]
    assert streamed and all(b["stream_options"] == {"include_usage": True} for b in streamed)


def test_an_answer_s_end_ends_its_in_flight_count(llm_gateway: LlmGateway) -> None:
    """An LLM call has no budget of the picker's, so no access-log entry ends it: the stream
    supervisor sees its answer end and ends the pick's in-flight count on its GPU, whose
    measured seconds per request then include it (placer/signals/gateway_in_flight.py)."""
    in_flight = llm_gateway.picker.picker.in_flight_gpus
    assert in_flight is not None
    for stream in (True, False):
        status, h, _ = post(llm_gateway, "/v1/chat/completions", chat(max_tokens=3, stream=stream),
                            {"x-slo-tpot-ms": "5000"})
        assert status == 200
        gpu = llm_gateway.picker.picker.recent[h["x-policyc-decision-id"]].gpu_key
        deadline = time.monotonic() + 30
        while in_flight.count(gpu) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_flight.count(gpu) == 0, f"{gpu}: {in_flight.count(gpu)} still in flight after the answers ended"
        assert in_flight.seconds(gpu) is not None  # the ended call was measured there


def test_the_first_token_teaches_the_placer_what_the_contract_s_prediction_left_out(llm_gateway: LlmGateway) -> None:
    """The stream supervisor measures each request's first token and hands it to the placer with
    the decision id; the placer learns, on a GPU where it had nothing in flight, the measured
    time less the contract's predicted TTFT (placer/signals/predicted_ttft.py's overhead)."""
    in_flight = llm_gateway.picker.picker.in_flight_gpus
    assert in_flight is not None
    deadline = time.monotonic() + 30
    while in_flight.busy() and time.monotonic() < deadline:  # the earlier tests' answers ended
        time.sleep(0.05)
    recent = llm_gateway.picker.picker.recent
    before = {p.gpu_key: in_flight.overhead(p.gpu_key) for p in list(recent.values())}  # the earlier tests' picks
    status, h, _ = post(llm_gateway, "/v1/chat/completions", chat(max_tokens=3, stream=True), {"x-slo-tpot-ms": "5000"})
    assert status == 200
    did = h["x-policyc-decision-id"]
    gpu = recent[did].gpu_key
    ev = llm_gateway.supervisor.evidence[did][0]
    assert ev.attempt == 1 and ev.ttft_s is not None
    learned, was = in_flight.overhead(gpu), before.get(gpu)
    assert learned is not None and learned != was, f"{gpu}: no overhead learned from decision {did}"
    # the sample is the measured first token less a prediction of zero or more; the GPU's mean moves toward it
    assert learned <= (ev.ttft_s if was is None else was + ALPHA * (ev.ttft_s - was)) + 1e-12
    assert in_flight.first_token(did, 1.0) is None  # once per request: the supervisor's call was the one


def test_http2_client_streams(llm_gateway: LlmGateway) -> None:
    out = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "-N", "-D", "-", "-H", "content-type: application/json",
                          "--data", json.dumps(chat(max_tokens=3, stream=True)),
                          f"http://{llm_gateway.listen}/v1/chat/completions"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("HTTP/2 200"), out.stdout[:300]
    assert out.stdout.count("data: ") >= 4 and "data: [DONE]" in out.stdout


def test_models_route(llm_gateway: LlmGateway) -> None:
    host, port = llm_gateway.listen.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("GET", "/v1/models", headers={"x-model": LLM})
    r = c.getresponse()
    body = r.read()
    c.close()
    assert r.status == 200, (r.status, r.getheaders(), body[:300])
    assert body, (r.status, dict(r.getheaders()))
    assert json.loads(body)["data"][0]["id"] == LLM


LONG = " ".join(f"w{i}" for i in range(1500))  # well over 800 tokens, under the 1,024 context? no: over both
# (name, path, body, headers, status, code, words of the reason)
BAD = [
    ("malformed json", "/v1/chat/completions", b'{"model": "tiny-llm", "messages": [', {}, 400, "invalid_json", "not JSON"),
    ("not an object", "/v1/chat/completions", b'["tiny-llm"]', {}, 400, "invalid_json", "must be a JSON object"),
    ("not utf-8", "/v1/completions", b'{"model": "tiny-llm", "prompt": "\xc3\x28"}', {}, 400, "invalid_encoding",
     "not UTF-8"),
    ("missing model", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, {}, 400, "model_not_found",
     "no model"),
    ("unknown model", "/v1/chat/completions", chat(model="gpt-x"), {}, 400, "model_not_found", "unknown model `gpt-x`"),
    ("header and body disagree", "/v1/chat/completions", chat(), {"x-model": LITE}, 400, "model_mismatch",
     "X-Model header `tiny-llm-lite`"),
    ("bad max_tokens", "/v1/chat/completions", chat(max_tokens=-1), {}, 400, "invalid_request_body", "`max_tokens`"),
    ("over the context", "/v1/completions", {"model": LLM, "prompt": LONG * 2}, {}, 400, "context_length_exceeded",
     "context of 1024 tokens"),
    ("over the size limit", "/v1/completions", {"model": LLM, "prompt": "x" * (MAX_BODY + 10)}, {}, 413,
     "request_too_large", f"limit of {MAX_BODY} bytes"),
]


@pytest.mark.parametrize(("name", "path", "body", "headers", "status", "code", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_bodies_through_envoy(llm_gateway: LlmGateway, name: str, path: str, body: bytes | dict[str, Any],
                                  headers: dict[str, str], status: int, code: str, words: str) -> None:
    got, h, raw = post(llm_gateway, path, body, headers)
    assert got == status, (name, got, raw[:300])
    assert words in h.get("x-policyc-reason", ""), (name, h)
    if h.get("x-policyc-refusal") != "bad-body":  # Envoy's own 413 (over its buffer): its plain body
        return
    err = json.loads(raw)["error"]
    assert err["code"] == code and words in err["message"], (name, err)


def test_a_large_body_from_http2_is_413_with_the_reason(llm_gateway: LlmGateway, tmp_path: Path) -> None:
    """A 3 MiB body from an HTTP/2 client: refused 413 with the reason, by the picker (over its
    limit) or, where it is over the listener's buffer, by Envoy itself."""
    big = tmp_path / "big.json"
    big.write_bytes(json.dumps({"model": LLM, "prompt": "x" * (3 << 20)}).encode())
    out = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "-D", "-", "-o", "/dev/null", "-H",
                          "content-type: application/json", "--data-binary", f"@{big}",
                          f"http://{llm_gateway.listen}/v1/completions"], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("HTTP/2 413"), (out.stdout[:300], out.stderr[:300])
    reason = next(line for line in out.stdout.splitlines() if line.startswith("x-policyc-reason: "))
    assert f"over the gateway's limit of {MAX_BODY} bytes" in reason or "over what the gateway buffers" in reason


def test_a_body_too_slow_is_408(llm_gateway: LlmGateway) -> None:
    host, port = llm_gateway.listen.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"model\": ")
        t0 = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        took = time.monotonic() - t0
    head = data.decode("latin-1")
    assert head.startswith("HTTP/1.1 408"), head[:300]
    assert f"within the gateway's {BODY_TIMEOUT_MS} ms" in head and '"code":"request_timeout"' in head.replace(" ", "")
    assert took >= BODY_TIMEOUT_MS / 1e3 * 0.9


def test_a_body_that_arrives_in_pieces_is_read_whole_and_served(llm_gateway: LlmGateway) -> None:
    """Full duplex: Envoy passes the body's pieces as they arrive; the picker reads them to the
    end, picks on the whole body and gives it back, and the server gets all of it."""
    host, port = llm_gateway.listen.split(":")
    body = json.dumps(chat("count " * 200, max_tokens=3)).encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:40])
        time.sleep(0.3)
        s.sendall(body[40:400])
        time.sleep(0.3)
        s.sendall(body[400:])
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, answer = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data[:400]
    assert b"x-policyc-instance:" in head.lower() and b'"choices"' in answer, data[:600]


def test_a_rule_on_prompt_tokens_refuses_with_its_source(llm_gateway: LlmGateway) -> None:
    from tokenizers import Tokenizer
    assert llm_gateway.tokenizer is not None
    tok = Tokenizer.from_file(str(llm_gateway.tokenizer))
    prompt = "def"
    while len(tok.encode(prompt).ids) <= 850:  # over the rule's 800 tokens, under the 1,024 context
        prompt += " return value" * 20
    status, h, raw = post(llm_gateway, "/v1/completions", {"model": LLM, "prompt": prompt, "max_tokens": 1})
    assert status == 403, raw[:300]
    assert "llm-prompts.prompt-budget" in h["x-policyc-rule"].split(","), h  # with routing.pinned-model: together
    err = json.loads(raw)["error"]
    assert "prompt-budget" in err["message"] and "tiny-llm.contract" in err["message"], err
    small = post(llm_gateway, "/v1/completions", {"model": LLM, "prompt": "short prompt", "max_tokens": 1})
    assert small[0] == 200


def test_tokens_file_is_real(tmp_path: Path) -> None:
    """The rig's tokenizer is a real tokenizer.json the `tokenizers` library loads."""
    from tokenizers import Tokenizer
    assert Tokenizer.from_file(str(make_tokenizer(tmp_path))).get_vocab_size() > 256


def fake_stats(gw: LlmGateway, model: str) -> list[dict[str, Any]]:
    out = []
    for f in gw.fakes:
        if f.model == model:
            c = http.client.HTTPConnection("127.0.0.1", f.port, timeout=10)
            c.request("GET", "/fake/stats")
            out.append(json.loads(c.getresponse().read()))
            c.close()
    return out


def sse(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


def test_ttft_break_retries_once_on_the_backup(llm_gateway: LlmGateway) -> None:
    """The primary holds its first token 10 s; the stream's TTFT budget is 300 ms: Envoy resets
    that attempt and retries on the backup with X-Retry-Count: 1; the client sees one answer,
    long before the primary's first token (under 1 s on a quiet machine; 8 s leaves a loaded
    one room and still tells the break from a wait)."""
    t0 = time.monotonic()
    status, h, raw = post(llm_gateway, "/v1/chat/completions", chat(max_tokens=4, stream=True),
                          {"x-slo-ttft-ms": "300", "x-policyc-fake-ttft-ms": "10000"})
    took = time.monotonic() - t0
    assert status == 200 and h["x-envoy-attempt-count"] == "2", (status, h)
    assert served_model(llm_gateway, h) == LITE and took < 8.0, took
    events = sse(raw)
    assert events[-1] == "[DONE]" and sum(1 for e in events[:-1] if json.loads(e)["choices"]) == 4
    retried = [q for s in fake_stats(llm_gateway, LITE) for q in s["requests"]
               if q["headers"].get("x-policyc-decision-id") == h["x-policyc-decision-id"]]
    assert retried and retried[0]["headers"].get("x-retry-count") == "1"
    acts = llm_gateway.picker.acts.of(h["x-policyc-decision-id"], at_least=2, timeout=10)
    assert {a.kind for a in acts} >= {"cancel_stream", "redirect"}, acts


def test_tpot_stall_ends_the_stream_with_an_error_event(llm_gateway: LlmGateway) -> None:
    """3 s without a token after two, against a 250 ms TPOT budget: the client gets the error
    event and [DONE], the model server's stream is reset (it stops generating)."""
    cancelled = sum(s["cancelled"] for s in fake_stats(llm_gateway, LLM))
    status, h, raw = post(llm_gateway, "/v1/chat/completions", chat(max_tokens=6, stream=True),
                          {"x-slo-tpot-ms": "250", "x-policyc-fake-stall-after": "2", "x-policyc-fake-stall-ms": "3000"})
    assert status == 200
    events = sse(raw)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "tpot_exceeded" and "250 ms" in err["message"], err
    assert sum(1 for e in events[:-2] if json.loads(e).get("choices")) == 2  # the tokens sent before the stall
    did = h["x-policyc-decision-id"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(r.decision_id == did and r.kind == "cancel_stream"
                                                  for r in llm_gateway.supervisor.records):
        time.sleep(0.05)
    kinds = [r.kind for r in llm_gateway.supervisor.records if r.decision_id == did]
    assert "cancel_stream" in kinds and "report_anomaly" in kinds and "accounting" in kinds, kinds
    audited = read_audit_actions(llm_gateway, did, "cancel_stream")
    assert audited and "TPOT budget of 250 ms" in audited[0]["detail"]
    deadline = time.monotonic() + 10
    while sum(s["cancelled"] for s in fake_stats(llm_gateway, LLM)) == cancelled and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sum(s["cancelled"] for s in fake_stats(llm_gateway, LLM)) > cancelled  # the server saw its stream reset


def read_audit_actions(gw: LlmGateway, decision_id: str, kind: str, timeout: float = 15.0) -> list[dict[str, Any]]:
    """The action records of `decision_id` of `kind` as the audit log stored them (read back
    from its file: what an auditor sees)."""
    from policyc.audit.query import AuditReader

    deadline = time.monotonic() + timeout
    while True:
        with AuditReader.open(gw.workdir / "audit.db") as reader:
            found = [json.loads(e.record.model_dump_json()) for e in reader.actions_for(decision_id)
                     if e.record.kind == kind]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_audit_tokens_equal_the_servers_usage(llm_gateway: LlmGateway) -> None:
    for stream in (False, True):
        status, h, raw = post(llm_gateway, "/v1/chat/completions", chat("one two three four", max_tokens=7, stream=stream))
        assert status == 200
        if stream:
            usage = next(json.loads(e)["usage"] for e in sse(raw)[:-1] if json.loads(e).get("usage"))
        else:
            usage = json.loads(raw)["usage"]
        did = h["x-policyc-decision-id"]
        records = read_audit_actions(llm_gateway, did, "accounting", timeout=40.0)
        kept = [(r.kind, r.detail) for r in llm_gateway.supervisor.records if r.decision_id == did]
        assert records, (did, stream, kept, llm_gateway.supervisor.counts)
        llm = records[0]["llm"]
        assert llm["prompt_tokens"]["value"] == usage["prompt_tokens"] and llm["prompt_tokens"]["source"] == "measured"
        assert llm["completion_tokens"]["value"] == usage["completion_tokens"] == 7
        assert llm["ttft_seconds"]["source"] == "measured" and llm["ttft_seconds"]["value"] > 0
        assert llm["ttft_budget_seconds"]["source"] == "estimated" and llm["ttft_budget_seconds"]["value"] == 0.5
        assert llm["flops"]["source"] == "estimated"
        est = llm["ttft_estimated_seconds"]  # the contract's FLOPs at the placed GPU class's rate
        assert est["source"] == "estimated" and 0 < est["value"] <= llm["total_estimated_seconds"]["value"]
        if stream:
            assert llm["tpot_seconds"]["source"] == "measured"


def test_client_disconnect_cancels_the_upstream(llm_gateway: LlmGateway) -> None:
    before = sum(s["cancelled"] for s in fake_stats(llm_gateway, LLM))
    host, port = llm_gateway.listen.split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    body = json.dumps(chat(max_tokens=200, stream=True)).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"x-policyc-fake-gap-ms: 50\r\nx-slo-tpot-ms: 5000\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(65536)
    s.close()  # 3 of 200 tokens read: the client leaves
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if sum(x["cancelled"] for x in fake_stats(llm_gateway, LLM)) > before:
            return
        time.sleep(0.1)
    pytest.fail("the model server kept generating after the client left")


def test_the_tokenizer_is_found_in_the_registered_model_dir(tmp_path: Path) -> None:
    """No --tokenizer: the picker loads the one in the folder the instances registered
    (`model_dir`, as `policyc modelserver --engine vllm --register` labels them)."""
    from tokenizers import Tokenizer
    folder = make_tokenizer(tmp_path / "model").parent
    gw = start_llm_gateway(model_dir=folder)
    try:
        status, h, _ = post(gw, "/v1/completions", {"model": LLM, "prompt": "def f(): return 1", "max_tokens": 1})
        assert status == 200
        read = gw.picks.recent[h["x-policyc-decision-id"]]
        want = len(Tokenizer.from_file(str(folder / "tokenizer.json")).encode("def f(): return 1").ids)
        assert read.prompt.counted and read.prompt.tokens == want
    finally:
        gw.stop()


def test_oip_rest_is_routed_to_an_http1_endpoint(tmp_path: Path) -> None:
    """A KServe model server's OIP v2 REST port, registered with `endpoint_protocol: http1`:
    `POST /v2/models/M/infer` through the gateway reaches it (picked on its headers)."""
    from policyc.modelserver.client import rest_body, token_ids
    from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
    from policyc.modelserver.model_files import write_model_files

    from gateway_rig import PRIMARY

    from llm_rig import llm_bundle
    files = write_model_files(llm_bundle().contract(PRIMARY), tmp_path / "models")  # type: ignore[arg-type]
    models = ModelPool([ServerSpec((InstanceSpec(f"{PRIMARY}@rest", files.full),))], workdir=tmp_path / "servers").start(timeout=60)
    gw = None
    try:
        rest = models.instances[0].http_endpoint
        gw = start_llm_gateway(served=[(PRIMARY, rest)])
        # a generous SLO: the budget (92.5 % of it) is not this test's, and a loaded machine's first REST call is slow
        for _ in range(3):
            status, h, raw = post(gw, f"/v2/models/{PRIMARY}/infer", rest_body(token_ids(16)),
                                  {"x-model": PRIMARY, "x-data-region": "us-west", "x-tenant": "acme-bank",
                                   "x-slo-latency": "10s"})
            if status == 200:
                break
        assert status == 200, (status, h, raw[:300])
        assert h["x-policyc-decision-id"] and json.loads(raw)["outputs"], raw[:300]
        assert gw.server.engine.state.registry.get(gw.instances[rest]).deployment.endpoint == rest
    finally:
        if gw is not None:
            gw.stop()
        models.stop()


def test_envoy_logs_no_lua_error_for_a_pick_with_retry_headers(llm_gateway: LlmGateway) -> None:
    """A stream with a TTFT budget carries its retry headers to every attempt; the per-attempt
    Lua filter reads the attempt count, which Envoy may not have set yet: `tonumber(nil)` there
    was a script error in Envoy's log on every such request (the request went on, the log filled)."""
    log = llm_gateway.workdir / "envoy" / "envoy.log"
    before = log.read_text(errors="replace").count("script log")
    status, _, _ = post(llm_gateway, "/v1/chat/completions", chat(max_tokens=2, stream=True), {"x-slo-ttft-ms": "2000"})
    assert status == 200
    time.sleep(0.2)  # Envoy's log is written by its own thread
    text = log.read_text(errors="replace")
    assert text.count("script log") == before, text[-2000:]
