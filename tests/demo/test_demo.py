"""The README's main job: `policyc demo` runs end to end on the real data plane (Envoy,
KServe model servers, policyc as the endpoint picker) and stops cleanly. As root with
network namespaces (CI), on the namespace fleet: three hosts, each with its TPM enrolled and
attested and its agent starting and registering its model servers, the congestion a real
`tc` shaping of one host's uplink; elsewhere on the simulated cluster, said in one line.

One run serves every test here (the demo takes a minute or more: it starts its own vLLM),
run as a user would: the command in a subprocess, with `--workdir out/`, the relative
path of its own --help example, in a working directory that holds `out/` (the demo once
handed `out/gateway/picker.sock` to Envoy, which takes only absolute socket paths, and
died with a traceback)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from policyc.cluster.netns_agents import unavailable
from policyc.demo.llm_scene import SCENE_CONTRACT

RULE_LINE = 1 + SCENE_CONTRACT.read_text().splitlines().index("  rule prompt-budget {")
# the LLM scene waits for real vLLM to start (~70 s on a quiet machine, more on CI's); pytest-timeout's limit
# covers the fixture's setup in the first test that asks for it
DEMO_TIMEOUT_S = 600


@dataclass(frozen=True)
class DemoRun:
    cwd: Path  # the working directory the command ran in
    code: int
    stdout: str
    stderr: str

    @property
    def out(self) -> Path:
        return self.cwd / "out"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    cwd = tmp_path_factory.mktemp("demo-cwd")
    r = subprocess.run([sys.executable, "-m", "policyc.cli.main", "demo", "--workdir", "out/"], cwd=cwd,
                       capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)
    return DemoRun(cwd, r.returncode, r.stdout, r.stderr)


@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_runs_end_to_end(demo: DemoRun) -> None:
    text = demo.stdout
    assert "Traceback" not in text + demo.stderr, (text + demo.stderr)[-3000:]
    assert demo.code == 0, (text + demo.stderr)[-3000:]
    on_hosts = not unavailable()  # root, iproute2, etcd, swtpm, namespaces: CI has them all
    fleet_line = ("fleet: hosts as network namespaces on this machine" if on_hosts
                  else "fleet: falling back to the simulated cluster, no namespace fleet here: ")
    assert fleet_line in text.splitlines()[1] + text.splitlines()[0], text[:600]  # said once, at the start
    for expected in ((
        # three namespace hosts: each TPM key enrolled and the quote verified, each agent starting and registering its
        # model servers on its host's address; the congestion a real tc shaping of one uplink, measured by its agent
        "operator: `policyc agent enroll --host host-", "TPM attested — quote over PCRs 0,1,2,7 verified by replica",
        "(backup) → 10.", "registered by host-", "(simulated topology: a namespace has no GPU)",
        "uplink eth0 shaped with tc", "'s agent measured its eth0 queue", "Explain: placer: chose host-",
        "reports its queue empty again after", "hosts torn down: agents and their model servers, TPMs, etcd, namespaces",
        # a link fails on a host: the fenced leader sends the heal to that host's agent, which answers (dry run)
        "'s agent measured data0 down (operstate)", "sent to host-", "would take data0 down and up in host",
        "(source: agent host-", "the decision service's own machine ran nothing",
    ) if on_hosts else (
        "(backup) → 127.0.0.1:", "pinned at 89 % watermark",
    )) + (
        # the fleet: simulated, a refused ONNX model, the real servers with their endpoints
        "ONNX model missing a contract section → INVALID_ARGUMENT", "(placement only, no endpoint)",
        "full/simplified variants, also answers fraud-scorer",
        # real answers and refusals through Envoy
        "OK  fraud-scorer answered by `fraud-scorer@", "OK  clinical-notes answered by `clinical-notes@",
        "PERMISSION_DENIED (HTTP 403, rule)  rejected by `routing.data-region`, `compliance.healthcare-eu`",
        "INVALID_ARGUMENT (HTTP 400, bad-header)  header `X-SLO-Latency`: `fast` is not a time",
        "UNAVAILABLE (HTTP 503, no-instance)  no instance can serve this request", "none has an endpoint",
        "did you mean `X-Data-Region`?", "did you mean `acme-bank`?", "HTTP 400  header `x-data-regoin`",
        # congestion moves the traffic, the stalled request is broken at its budget and retried
        "traffic moved: `fraud-scorer@",
        "(simplified variant,", "retry 1)", "1 stream reset by Envoy while held", "upstream_rq_per_try_timeout +1",
        "upstream_cx_destroy +0", "the backup saw x-retry-count: 1",
        "action: cancel_stream", "action: redirect", "action: report_anomaly", "(the reported anomaly lowered its health)",
        # the decision API alone
        "ADMITTED  recommender →", "`catalog-api` → http-us-west (direct,",
        "ADMITTED  support-chatbot →", "`conversation-store` → host-", "/nvme (local, 3.20 ms ≤ 4 ms)",
        "`mars-1` is not a declared value of `request.region`",
        "self_heal_step  gpu_reset", "dry_run", "EXPLAIN", "demo finished",
        # every answered call through the gateway has measured network bytes and compute seconds
        "measured per call through the gateway: ",
        # the LLM scene on real vLLM (CI has .venv-vllm): routed by the body, streamed, a long prompt refused by its
        # rule and line, a stalled first token broken and answered by the backup, the audit's tokens (the retried
        # attempt's record too: its loss under load was the supervisor writing it after a write a reset could cancel)
        "LLM traffic on real vLLM", "(no X-Model header: the body names the model;",
        "OK  HTTP 200 from `tiny-llama@",
        "PERMISSION_DENIED (HTTP 403, rule)", "Envoy attempts 2, upstream_rq_per_try_timeout +1",
        "retried on attempt 2 to `tiny-llama-lite` at", "with x-retry-count: 1",
        "audit, the streamed chat: prompt", "audit, the retried stream: prompt", "LLM scene:", "vLLM stopped",
    ):
        assert expected in text, expected
    if on_hosts:  # the placement left the shaped host once its agent measured the queue over the placer's 80 % limit
        queue = re.search(r"'s agent measured its eth0 queue (\d+)% full", text)
        assert queue and int(queue[1]) >= 80, text[-3000:]
    stream = re.search(r"(\d+) events streamed, the first after (\d+) ms, \[DONE\] after (\d+) ms; usage (\d+) prompt \+ "
                       r"(\d+) completion tokens", text)
    assert stream and int(stream[5]) == 48 and int(stream[2]) <= int(stream[3]), text[-3000:]
    audit = re.search(r"audit, the streamed chat: prompt (\d+) \(measured\) \+ completion (\d+) \(measured\) tokens", text)
    assert audit and (audit[1], audit[2]) == (stream[4], stream[5])  # the audit's tokens are the server's usage
    # the refusing rule with its source line (the file as the compiler names it: from the demo's working directory)
    assert re.search(r"`llm-demo\.prompt-budget` at \S*demo/llm-scene\.contract:" + str(RULE_LINE) + r"\)", text), text[-3000:]
    long_prompt = re.search(r"a prompt of (\d+) tokens", text)
    assert long_prompt and int(long_prompt[1]) > 800
    # every model server, agent and Envoy it started is gone, and the hosts' namespaces and bridge with them
    pids = [int(p) for p in re.findall(r"(?:Envoy|vLLM|`policyc agent run`) \(pid (\d+)\)", text)]
    if on_hosts:
        bridge = re.search(r"on bridge (\S+) ", text)
        namespaces = re.findall(r"in namespace (\S+),", text)
        assert bridge and len(namespaces) == 3, text[:3000]
        assert not subprocess.run(["ip", "link", "show", bridge[1]], capture_output=True).stdout
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert not set(namespaces) & set(left), left
    pids += [json.loads(f.read_text())["pid"] for f in (demo.out / "servers").glob("server-*/ready.json")]
    assert pids and not any(os.path.exists(f"/proc/{p}") for p in pids)


@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_with_a_relative_workdir_keeps_its_files_there(demo: DemoRun) -> None:
    """`--workdir out/` is taken relative to where the command ran, and what the demo keeps is there."""
    assert demo.code == 0 and "Traceback" not in demo.stdout + demo.stderr, (demo.stdout + demo.stderr)[-3000:]
    assert "demo finished" in demo.stdout
    assert (demo.out / "audit.db").is_file()
    pids = [json.loads(f.read_text())["pid"] for f in demo.out.glob("servers/server-*/ready.json")]
    assert pids and not any(os.path.exists(f"/proc/{p}") for p in pids)
