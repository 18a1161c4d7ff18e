"""Real vLLM servers on the project's tiny model (started once per session by `vllm_servers`
through `policyc modelserver --engine vllm`): chat and completions, streaming and not,
/v1/models, /metrics; registration with a real decision service carrying the contract that
travels with the model; the command's usage errors (no vLLM started for those)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from policyc.client import ClientError, DecisionClient
from policyc.cli.llm_serving import labels, load_model_contract, register_instance
from policyc.compiler.pipeline import compile_paths
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet
from policy_text import REPO

POLICYC = [sys.executable, "-m", "policyc.cli.main"]


def post(endpoint: str, path: str, body: dict[str, Any], timeout: float = 60.0) -> tuple[int, dict[str, Any]]:
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def stream(endpoint: str, path: str, body: dict[str, Any], timeout: float = 60.0) -> list[tuple[float, str]]:
    """The SSE `data:` payloads of a streamed answer, each with the time it arrived."""
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        assert r.getheader("content-type", "").startswith("text/event-stream")
        out: list[tuple[float, str]] = []
        while True:
            line = r.readline()
            if not line:
                break
            text = line.decode().strip()
            if text.startswith("data: "):
                out.append((time.monotonic(), text[len("data: "):]))
        return out
    finally:
        conn.close()


def get(endpoint: str, path: str) -> tuple[int, bytes]:
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_two_instances_on_their_own_cores(vllm_servers):
    assert len(vllm_servers.instances) == 2
    assert len(set(vllm_servers.endpoints)) == 2
    for inst in vllm_servers.instances:
        status, body = get(inst.endpoint, "/v1/models")
        assert status == 200
        assert [m["id"] for m in json.loads(body)["data"]] == [vllm_servers.model]
    cpus = [i.cpu for i in vllm_servers.instances]
    assert cpus == ["auto", "auto"] or len(set(cpus)) == 2, cpus


@pytest.mark.parametrize("which", [0, 1])
def test_chat_completion(vllm_servers, which):
    inst = vllm_servers.instances[which]
    status, body = post(inst.endpoint, "/v1/chat/completions", {
        "model": vllm_servers.model, "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 12, "ignore_eos": True})
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["model"] == vllm_servers.model
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str) and msg["content"]
    assert body["usage"]["completion_tokens"] == 12  # ignore_eos: exactly max_tokens
    # the ChatML template wraps the one user turn: more tokens than the bare words
    assert body["usage"]["prompt_tokens"] > 4


def test_completion(vllm_servers):
    inst = vllm_servers.instances[0]
    status, body = post(inst.endpoint, "/v1/completions", {
        "model": vllm_servers.model, "prompt": "def fibonacci(n):", "max_tokens": 9, "ignore_eos": True})
    assert status == 200, body
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 9
    assert isinstance(body["choices"][0]["text"], str)


def test_chat_streaming(vllm_servers):
    inst = vllm_servers.instances[1]
    events = stream(inst.endpoint, "/v1/chat/completions", {
        "model": vllm_servers.model, "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": 40, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]]
    # one chunk per token or a few, not one buffered answer: vLLM merges the deltas its API
    # process has not yet sent (random weights also sample byte fragments it holds back), so
    # on a loaded machine many tokens can share a chunk; more than one chunk is the claim
    assert len(content) >= 2
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 40
    # tokens arrive as they are generated: the first chunk comes well before the last one
    times = [t for (t, d) in events[:-1] if json.loads(d)["choices"]]
    assert times[-1] > times[0]


def test_completion_streaming(vllm_servers):
    inst = vllm_servers.instances[0]
    events = stream(inst.endpoint, "/v1/completions", {
        "model": vllm_servers.model, "prompt": "import os\n", "max_tokens": 64, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}})
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in events[:-1]]
    # streamed: more than one chunk (vLLM merges deltas not yet sent, so a loaded machine sees fewer than one a token)
    assert sum(1 for c in chunks if c["choices"]) >= 2
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 64


def test_metrics_route_has_the_load_gauges(vllm_servers):
    status, body = get(vllm_servers.instances[0].endpoint, "/metrics")
    assert status == 200
    text = body.decode()
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket"):
        assert f'\n{name}{{' in text, name


# ---------------------------------------------------------------------------- registration

@pytest.fixture(scope="module")
def decision_service(vllm_servers):
    """A real decision service whose bundle holds the model's own contract (compiled from the
    file in the model folder) and the GPU catalog, on a small simulated cluster for the
    deployment's facts."""
    result = compile_paths([vllm_servers.contract_path, REPO / "policies" / "gpu-catalog.contract"], analyse=False)
    assert result.bundle is not None, result.diagnostics
    server = DecisionServer(result.bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=4, gpus_per_host=2, hosts_per_rack=2),
                                                       enforcer=EnforcerMode.USERSPACE))
    thread = ServerThread(server)
    port = thread.start()
    try:
        yield server, result.bundle, f"127.0.0.1:{port}"
    finally:
        thread.stop()


def test_registered_with_its_endpoint_and_its_contract(vllm_servers, decision_service):
    server, bundle, target = decision_service
    assert server.cluster is not None
    contract = load_model_contract(vllm_servers.model_dir)
    slot = admissible_fleet(bundle, server.cluster.gpu_slots(), models=[vllm_servers.model])[0]
    inst = vllm_servers.instances[0]
    dep = {**slot.deployment.model_dump(), "endpoint": inst.endpoint}
    with DecisionClient(target, token=server.operator_token) as c:
        reply = register_instance(c, inst.instance_id, contract, dep, labels([], vllm_servers.model_dir))
        assert reply.instance_id == inst.instance_id and reply.model == vllm_servers.model
        listed = {i.id: i for i in c.list_instances(vllm_servers.model).instances}
        got = listed[inst.instance_id]
        assert got.deployment.endpoint == inst.endpoint
        assert got.labels["engine"] == "vllm" and got.labels["metrics"] == "vllm" and got.labels["endpoint_protocol"] == "http1"
        # a contract that drifted from the bundle's is refused, naming the field
        drifted = contract.model_copy(update={"compute": contract.compute.model_copy(update={"tokens": 2048})})
        with pytest.raises(ClientError) as e:
            register_instance(c, inst.instance_id + "-drift", drifted, dep, {})
        assert "drift" in e.value.message and "compute.tokens" in e.value.message
        c.deregister(inst.instance_id)


# ---------------------------------------------------------------------------- usage errors

def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*POLICYC, *argv], capture_output=True, text=True, timeout=120)


def test_usage_errors_name_the_problem(tmp_path: Path):
    r = run_cli("modelserver", "--engine", "vllm", "--model", str(tmp_path))
    assert r.returncode == 2 and "no config.json" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "config.json").write_text("{}")
    r = run_cli("modelserver", "--engine", "vllm", "--model", str(tmp_path), "--model", str(tmp_path))
    assert r.returncode == 2 and "one model folder per process" in r.stderr
    r = run_cli("modelserver", "--engine", "vllm", "--model", str(tmp_path), "--grpc-port", "9")
    assert r.returncode == 2 and "--grpc-port" in r.stderr and "KServe" in r.stderr
    r = run_cli("modelserver", "--engine", "vllm", "--model", str(tmp_path), "--register")
    assert r.returncode == 2 and "--deploy" in r.stderr
    r = run_cli("modelserver", "--engine", "vllm", "--model", str(tmp_path))
    assert r.returncode == 1 and "policyc.contract" in r.stderr  # no contract travels with it
    (tmp_path / "policyc.contract").write_text('contract x version "1" {\n  compute {\n    tokens: many\n  }\n}\n')
    r = run_cli("modelserver", "--engine", "vllm", "--model", str(tmp_path))
    assert r.returncode == 1 and "does not compile" in r.stderr and "policyc.contract:" in r.stderr
