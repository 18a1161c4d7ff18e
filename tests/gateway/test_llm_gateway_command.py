"""`policyc gateway` itself serves LLM traffic: an OpenAI-compatible HTTP/1.1 server
registered with `endpoint_protocol: http1` gets chat requests routed by the body's model,
prompt tokens counted with the `--tokenizer` given, streams supervised (the answer's audit
record carries its tokens)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from llm_rig import LLM, llm_bundle, start_fake
from llm_support import make_tokenizer

from policyc.client import operator_channel
from policyc.compiler import bundle_io
from policyc.gateway.llm_routes import HTTP1, PROTOCOL_LABEL
from policyc.matcher.instance import Instance
from policyc.server import convert
from policyc.server.proto import pb_grpc

from gateway_rig import free_port

POLICYC = [sys.executable, "-m", "policyc.cli.main"]


def _slot():  # type: ignore[no-untyped-def]
    from policyc.placer import SimulatedCluster
    from policyc.server.config import ClusterSpec
    from policyc.server.fleet import admissible_fleet

    c = ClusterSpec()
    slots = SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack).gpu_slots()
    return next(i for i in admissible_fleet(llm_bundle(), slots, models=[LLM]))


def test_policyc_gateway_routes_and_supervises_llm_requests(tmp_path: Path) -> None:
    path = tmp_path / "bundle.json"
    bundle_io.write(llm_bundle(), path)
    tok = make_tokenizer(tmp_path / "tok")
    api, listen, admin, picker = free_port(), free_port(), free_port(), free_port()
    proc = subprocess.Popen(POLICYC + ["gateway", "--bundle", str(path), "--port", str(api), "--listen", f"127.0.0.1:{listen}",
                                       "--admin", f"127.0.0.1:{admin}", "--picker-port", str(picker),
                                       "--workdir", str(tmp_path / "gw"), "--tokenizer", f"{LLM}={tok}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    slot = _slot()
    fake = start_fake(slot.id, [LLM])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{api}") as probe:
            grpc.channel_ready_future(probe).result(timeout=30)
        with operator_channel(f"127.0.0.1:{api}") as ch:
            inst = Instance(id=slot.id, model=LLM, labels={PROTOCOL_LABEL: HTTP1},
                            deployment=slot.deployment.model_copy(update={"endpoint": fake.endpoint}))
            pb_grpc.DecisionsStub(ch).RegisterInstance(convert.register_request(inst), timeout=10)
        body = json.dumps({"model": LLM, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3,
                           "stream": True}).encode()
        deadline, status, raw, headers = time.monotonic() + 15, 0, b"", {}
        while time.monotonic() < deadline:  # the pool file is rewritten and Envoy loads it within a few hundred ms
            c = http.client.HTTPConnection("127.0.0.1", listen, timeout=10)
            c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            r = c.getresponse()
            status, raw, headers = r.status, r.read(), dict(r.getheaders())
            c.close()
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200, (status, headers, raw[:300])
        assert headers["x-policyc-instance"] == slot.id
        events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and any(json.loads(e).get("usage") for e in events[:-1])
        bad = http.client.HTTPConnection("127.0.0.1", listen, timeout=10)
        bad.request("POST", "/v1/chat/completions", b"{nope", {"content-type": "application/json"})
        r = bad.getresponse()
        assert r.status == 400 and "not JSON" in (r.getheader("x-policyc-reason") or "")
        bad.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        fake.process.terminate()
        fake.process.wait(10)
    assert proc.returncode == 0, err[-3000:]
