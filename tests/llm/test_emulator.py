"""The vLLM-compatible emulator: its metrics parse with the same code as vLLM's (and equal
prometheus_client's reading); its answers have vLLM's shape and token counts (the same
requests sent to real vLLM); its timing model batches, queues on KV capacity, caches
prefixes, charges prefill per prompt token, stretches with `slowdown`; a client that
disconnects stops its generation."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from metrics_reference import reference_figures
from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec
from policyc.modelserver.emulator_engine import TimingModel
from policyc.modelserver.llm_model import cached_llm_model
from policyc.placer.metrics_scraper import MetricsScraper
from policyc.placer.metrics_text import compile_map, read_figures
from policyc.placer.server_metric_names import narrowed_path, protocol

PAGE = Path(__file__).resolve().parent.parent / "fixtures" / "llm" / "vllm-0.32-metrics.txt"
VLLM_FAMILIES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket", "vllm:cache_config_info",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket")


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return cached_llm_model().dir


def request(endpoint: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, {"content-type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        return r.status, json.loads(raw) if r.getheader("content-type", "").startswith("application/json") else raw
    finally:
        conn.close()


def figures(endpoint: str) -> dict[str, float]:
    _, body = request(endpoint, "GET", "/metrics")
    return read_figures(body, compile_map(protocol("vllm")))[0]


def ttft(endpoint: str, body: dict[str, Any]) -> float:
    """Seconds from sending a streamed request to its first content chunk."""
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        t = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), {"content-type": "application/json"})
        r = conn.getresponse()
        first = None
        while line := r.readline():
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic() - t
        assert first is not None
        return first
    finally:
        conn.close()


def test_metrics_parse_with_the_same_code_as_vllms(model_dir):
    with EmulatorServer([EmulatorSpec("tiny-llama", model_dir)]) as srv:
        ep = srv.endpoints[0]
        assert request(ep, "POST", "/v1/completions", {"model": "tiny-llama", "prompt": "import os\n" * 50, "max_tokens": 5})[0] == 200
        _, body = request(ep, "GET", "/metrics")
    m = protocol("vllm")
    values, problems = read_figures(body, compile_map(m))
    assert values == reference_figures(body, m) and not problems
    vllm_values, _ = read_figures(PAGE.read_bytes(), compile_map(m))
    assert set(values) == set(vllm_values)  # every key vLLM's page gives, the emulator's gives
    text = body.decode()
    for family in VLLM_FAMILIES:
        assert f"\n{family}{{" in text, family
    assert values["ttft_count"] == 1 and values["prefix_cache_queries"] > 0
    assert values["block_size"] == 128


def test_the_narrowed_page_has_the_same_figures_as_the_whole_one(model_dir):
    """As vLLM's: `/metrics/?name[]=...` renders only the named series (prometheus_client's
    app), `/metrics` the whole page whatever the query; the scraper asks for the narrowed one."""
    m = protocol("vllm")
    with EmulatorServer([EmulatorSpec("tiny-llama", model_dir)]) as srv:
        ep = srv.endpoints[0]
        assert request(ep, "POST", "/v1/completions", {"model": "tiny-llama", "prompt": "import os\n" * 50, "max_tokens": 5})[0] == 200
        path = narrowed_path("vllm", m)
        assert path is not None
        _, narrow = request(ep, "GET", path)
        _, whole = request(ep, "GET", "/metrics")
        _, ignored = request(ep, "GET", "/metrics?" + path.split("?", 1)[1])
        with MetricsScraper(interval_s=0.05) as scraper:
            scraper.add(ep, "vllm")
            deadline = time.monotonic() + 10
            while (r := scraper.snapshot(ep)) is None or not r.values:
                assert time.monotonic() < deadline, r
                time.sleep(0.02)
    assert read_figures(narrow, compile_map(m)) == read_figures(whole, compile_map(m))
    assert len(narrow) * 4 < len(whole) and len(ignored) == len(whole)
    assert r.source == f"vllm http://{ep}/metrics/ (its 8 series: name[])" and r.values == read_figures(narrow, compile_map(m))[0]


def test_answers_have_vllms_shape_and_token_counts(vllm_servers, model_dir):
    """The same requests to real vLLM and to the emulator: the same keys, the same usage."""
    chat = {"model": "tiny-llama", "messages": [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "What is a prefix cache?"}],
            "max_tokens": 7, "ignore_eos": True}
    comp = {"model": "tiny-llama", "prompt": "class Stack:\n    def push(self, x):", "max_tokens": 5, "ignore_eos": True}
    real = vllm_servers.instances[0].endpoint
    with EmulatorServer([EmulatorSpec("tiny-llama", model_dir)]) as srv:
        emu = srv.endpoints[0]
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", comp)):
            s1, a = request(real, "POST", path, body)
            s2, b = request(emu, "POST", path, body)
            assert s1 == s2 == 200
            assert a["object"] == b["object"] and a["model"] == b["model"]
            counts = ("prompt_tokens", "completion_tokens", "total_tokens")
            assert [a["usage"][k] for k in counts] == [b["usage"][k] for k in counts], (path, a["usage"], b["usage"])  # same tokenizer and template
            assert {"index", "finish_reason"} <= set(b["choices"][0]) and b["choices"][0]["finish_reason"] == "length"
        s1, a = request(real, "POST", "/v1/completions", {**comp, "model": "other"})
        s2, b = request(emu, "POST", "/v1/completions", {**comp, "model": "other"})
        assert s1 == s2 == 404 and set(a) == set(b) == {"error"}
        assert request(emu, "GET", "/v1/models")[1]["data"][0]["id"] == "tiny-llama"


def test_streaming_chunks_usage_and_done(model_dir):
    with EmulatorServer([EmulatorSpec("tiny-llama", model_dir)]) as srv:
        host, port = srv.endpoints[0].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/chat/completions", json.dumps({
            "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True,
            "stream_options": {"include_usage": True}}), {"content-type": "application/json"})
        r = conn.getresponse()
        assert r.getheader("content-type", "").startswith("text/event-stream")
        events = [line[6:].strip() for line in r.read().split(b"\n") if line.startswith(b"data: ")]
        conn.close()
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 20 and content[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20


def test_batching_and_kv_capacity_queue_requests():
    timing = TimingModel(max_num_seqs=2, kv_blocks=64, block_size=16, max_model_len=512, decode_s_per_seq=2e-3)
    with EmulatorServer([EmulatorSpec("m", None, timing)]) as srv, MetricsScraper(interval_s=0.02) as scraper:
        ep = srv.endpoints[0]
        scraper.add(ep, "vllm")
        done = []
        workers = [threading.Thread(target=lambda: done.append(request(ep, "POST", "/v1/completions",
                                                                        {"model": "m", "prompt": "x" * 40, "max_tokens": 150})))
                   for _ in range(4)]
        for w in workers:
            w.start()
        seen = []
        deadline = time.monotonic() + 20
        while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
            r = scraper.snapshot(ep)
            if r is not None and r.values:
                seen.append(dict(r.values))
            time.sleep(0.01)
        for w in workers:
            w.join(30)
    assert all(s == 200 for s, _ in done) and len(done) == 4
    assert max(v["running"] for v in seen) == 2  # max_num_seqs
    assert max(v["queue_depth"] for v in seen) >= 1  # the others wait
    assert max(v["kv_cache_usage"] for v in seen) > 0.1  # 2 x (10 + 150 tokens) in 16-token blocks of 64


def test_prefill_costs_per_prompt_token_and_prefix_cache_skips_it():
    timing = TimingModel(prefill_s_per_token=200e-6, block_size=16)
    with EmulatorServer([EmulatorSpec("m", None, timing)]) as srv:
        ep = srv.endpoints[0]
        short = ttft(ep, {"model": "m", "prompt": "abcd" * 20, "max_tokens": 2})  # 20 tokens: 4 ms of prefill
        long_prompt = "".join(f"{i:04d}" for i in range(800))  # 800 tokens: 160 ms
        long = ttft(ep, {"model": "m", "prompt": long_prompt, "max_tokens": 2})
        again = ttft(ep, {"model": "m", "prompt": long_prompt, "max_tokens": 2})  # its blocks are cached
        f = figures(ep)
    assert long - short > 0.1, (short, long)
    assert again < long / 2, (long, again)
    assert f["prefix_cache_hits"] >= 784  # 49 of its 50 blocks found (the last token is always computed)


def test_slowdown_stretches_decoding():
    with EmulatorServer([EmulatorSpec("fast", None), EmulatorSpec("slow", None, slowdown=4.0)]) as srv:
        took = []
        for ep, name in zip(srv.endpoints, ("fast", "slow")):
            t = time.monotonic()
            assert request(ep, "POST", "/v1/completions", {"model": name, "prompt": "x", "max_tokens": 100})[0] == 200
            took.append(time.monotonic() - t)
    # 100 decode steps of one sequence in the timing model: ~0.19 s, 4x that slowed. The emulator's sleeps are never
    # early, so the slowed answer takes at least its stretched model time whatever the load; the unslowed one is
    # quicker (a ratio of the two failed at load 12: 0.47 s against 0.98 s, the machine's own delays added to both)
    t = TimingModel()
    decode = 100 * t.step_time(0, 1)
    assert took[1] >= 4.0 * decode * 0.95 and took[0] < took[1], (took, decode)


def test_a_client_that_disconnects_stops_its_generation():
    with EmulatorServer([EmulatorSpec("m", None)]) as srv:
        ep = srv.endpoints[0]
        host, port = ep.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 900, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data: " not in got:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
        deadline = time.monotonic() + 10
        while figures(ep).get("running") != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert figures(ep)["running"] == 1
        sock.close()
        deadline = time.monotonic() + 10
        while figures(ep).get("running") != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        f = figures(ep)
        _, page = request(ep, "GET", "/metrics")
    assert f["running"] == 0 and f["kv_cache_usage"] == 0
    assert b'finished_reason="abort"' in page
    generated = [line for line in page.decode().splitlines() if line.startswith("vllm:generation_tokens_total")]
    assert float(generated[0].split()[-1]) < 900  # it stopped early


def test_bad_bodies_get_openai_errors():
    with EmulatorServer([EmulatorSpec("m", None, TimingModel(max_model_len=64))]) as srv:
        ep = srv.endpoints[0]
        host, port = ep.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/v1/completions", b"{not json", {"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 400 and "not JSON" in json.loads(r.read())["error"]["message"]
        conn.close()
        s, b = request(ep, "POST", "/v1/completions", {"model": "m", "prompt": "x" * 400, "max_tokens": 5})
        assert s == 400 and "maximum context length" in b["error"]["message"]
        s, b = request(ep, "POST", "/v1/chat/completions", {"model": "m", "messages": "hi"})
        assert s == 400 and b["error"]["param"] == "messages"
        s, b = request(ep, "POST", "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 0})
        assert s == 400 and b["error"]["param"] == "max_tokens"


def test_the_command_serves_registers_and_deregisters(model_dir, tmp_path):
    """`policyc modelserver --engine emulator --register`: the whole command path (contract
    compiled from the model folder, registration through policyc.client with the operator
    token found for a loopback service, SIGTERM deregisters), without a vLLM start."""
    import signal
    import subprocess
    import sys

    from policy_text import REPO
    from policyc.client import DecisionClient
    from policyc.compiler.pipeline import compile_paths
    from policyc.server.app import DecisionServer, ServerThread
    from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
    from policyc.server.fleet import admissible_fleet

    bundle = compile_paths([model_dir / "policyc.contract", REPO / "policies" / "gpu-catalog.contract"], analyse=False).bundle
    assert bundle is not None
    server = DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=4, gpus_per_host=2, hosts_per_rack=2),
                                                enforcer=EnforcerMode.USERSPACE))
    thread = ServerThread(server)
    port = thread.start()
    try:
        assert server.cluster is not None
        d = admissible_fleet(bundle, server.cluster.gpu_slots(), models=["tiny-llama"])[0].deployment
        ready = tmp_path / "ready.json"
        proc = subprocess.Popen([sys.executable, "-m", "policyc.cli.main", "modelserver", "--engine", "emulator",
                                 "--model", str(model_dir), "--instance", "tiny-llama@emu-0", "--register",
                                 "--server", f"127.0.0.1:{port}", f"--token={server.operator_token or ''}",  # `=`: a token may begin with "-"
                                 *[a for k, v in d.model_dump().items() if k != "endpoint" for a in ("--deploy", f"{k}={v}")],
                                 "--ready-file", str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=10)
        facts = json.loads(ready.read_text())
        assert facts["registered"] and facts["engine"] == "emulator"
        with DecisionClient(f"127.0.0.1:{port}", token=server.operator_token) as c:
            listed = {i.id: i for i in c.list_instances("tiny-llama").instances}
            inst = listed["tiny-llama@emu-0"]
            assert inst.deployment.endpoint == facts["endpoint"]
            assert inst.labels["engine"] == "emulator" and inst.labels["metrics"] == "vllm"
            assert request(facts["endpoint"], "POST", "/v1/completions", {"model": "tiny-llama", "prompt": "x", "max_tokens": 3})[0] == 200
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            assert "tiny-llama@emu-0" not in {i.id for i in c.list_instances("tiny-llama").instances}
    finally:
        if proc.poll() is None:
            proc.kill()
        thread.stop()
