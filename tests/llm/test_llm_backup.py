"""The TTFT break and retry on a real vLLM backup: a stream whose first token has not come
within its budget is reset on the primary and answered by the backup, one answer for the client.

The primary is a stalled server (the project's vLLM emulator slowed 1000x: its first token
takes ~1.9 s, over the request's 1.5 s `x-slo-ttft-ms`); the backup `tiny-llama-lite` is one of
the session's real vLLM instances. The retry carries the client's body unchanged, so the
backup is served under the primary's model name: the same vLLM serves the same weights as
`tiny-llama` (the backup contract is what the breaker redirects to and what the placer and
the audit price; the body's `model` is the name vLLM serves). Completions, not chat: a chat
stream's first event is the role chunk, which the emulator sends before its first token."""

from __future__ import annotations

import http.client
import json
import re
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from vllm_fleet import VllmFleet

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from llm_rig import LlmGateway, start_llm_gateway  # noqa: E402

from policyc.demo.llm_scene import SCENE_CONTRACT, STALL_SLOWDOWN  # noqa: E402
from policyc.gateway.llm_routes import POOL_HTTP1_CLUSTER  # noqa: E402
from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec  # noqa: E402

BACKUP = "tiny-llama-lite"  # demo/llm-scene.contract: its rule, its backup, the breaker that redirects to it


@pytest.fixture(scope="module")
def stalled(vllm_servers: VllmFleet) -> Iterator[EmulatorServer]:
    emulator = EmulatorServer([EmulatorSpec(vllm_servers.model, vllm_servers.model_dir, slowdown=STALL_SLOWDOWN)]).start()
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def gw(vllm_servers: VllmFleet, stalled: EmulatorServer) -> Iterator[LlmGateway]:
    g = start_llm_gateway(tokenizer=vllm_servers.model_dir, model_dir=vllm_servers.model_dir,
                          contracts=(vllm_servers.contract_path, SCENE_CONTRACT),
                          served=[(vllm_servers.model, stalled.endpoints[0]), (BACKUP, vllm_servers.endpoints[1])])
    yield g
    g.stop()


def successes(endpoint: str) -> float:
    """vLLM's own count of the requests it finished (its /metrics)."""
    c = http.client.HTTPConnection(*endpoint.split(":"), timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def test_a_stalled_first_token_is_answered_by_the_vllm_backup(gw: LlmGateway, vllm_servers: VllmFleet) -> None:
    backup = vllm_servers.endpoints[1]
    per_try = f"cluster.{POOL_HTTP1_CLUSTER}.upstream_rq_per_try_timeout"
    timeouts, served = gw.envoy.stats(per_try).get(per_try, 0), successes(backup)
    host, port = gw.listen.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    t0 = time.monotonic()
    # the TTFT budget: the request's own 1.5 s (both attempts are held to it: under the stalled server's ~1.9 s,
    # room for the backup's first token on a loaded machine); the gap between tokens too (vLLM may pause > 50 ms)
    c.request("POST", "/v1/completions", json.dumps({"model": vllm_servers.model, "prompt": "def route(request):",
                                                     "max_tokens": 12, "stream": True}).encode(),
              {"content-type": "application/json", "x-slo-ttft-ms": "1500", "x-slo-tpot-ms": "5000"})
    r = c.getresponse()
    raw = r.read()
    took = time.monotonic() - t0
    c.close()
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert r.status == 200 and r.getheader("x-envoy-attempt-count") == "2", (r.status, r.getheaders(), raw[:300])
    assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events[-3:]
    usage = next(json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage"))
    assert usage["completion_tokens"] == 12  # one whole answer, from the backup
    assert took < 60
    assert gw.envoy.stats(per_try).get(per_try, 0) == timeouts + 1
    deadline = time.monotonic() + 10
    while successes(backup) < served + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert successes(backup) == served + 1  # the real vLLM backup answered it
    did = r.getheader("x-policyc-decision-id") or ""
    acts = gw.picker.acts.of(did, at_least=2, timeout=10)
    redirect = [a for a in acts if a.kind == "redirect"]
    assert {a.kind for a in acts} >= {"cancel_stream", "redirect"}, acts
    assert f"to `{BACKUP}` at {backup} with x-retry-count: 1" in redirect[0].detail, redirect[0].detail
