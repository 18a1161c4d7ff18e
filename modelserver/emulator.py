"""A vLLM-compatible model-server emulator: vLLM's OpenAI routes and its `vllm:*` metrics,
with a timing model instead of a model (`emulator_engine.py`), so a fleet of 32-64
"servers" fits on one machine where two real vLLM instances are all that fit.

    server = EmulatorServer([EmulatorSpec("tiny-llama", model_dir)]).start()   # its own thread and loop
    server.endpoints[0]          # "127.0.0.1:40123": POST /v1/chat/completions, /v1/completions,
                                 # GET /v1/models, /health, /metrics
    server.stop()

- Routes and bodies as vLLM 0.32 answers them: `chat.completion` / `text_completion`
  objects with `usage`; with `"stream": true`, server-sent events, one token per chunk,
  `stream_options.include_usage` adding a last chunk with the usage, then `data: [DONE]`;
  `max_tokens` (or `max_completion_tokens`) tokens exactly (the emulator never stops early:
  vLLM's `ignore_eos`); OpenAI error objects for bad bodies (400), an unknown model (404) and
  a prompt over the context (400). A client that disconnects aborts its sequence (it stops
  generating and frees its KV blocks: visible in `vllm:num_requests_running`).
- Tokens: counted with the model folder's own `tokenizer.json` (the `tokenizers` library)
  when it has one, so prompt tokens and prefix-cache blocks match the real server's; else
  one token per 4 bytes. Chat messages are rendered with ChatML, the tiny model's template.
- `/metrics` (and `/metrics/`, narrowed by `name[]` as vLLM's is) with vLLM's names, types and labels (`engine`, `model_name`), through
  prometheus_client as vLLM does: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc`, `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`,
  `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, `vllm:num_preemptions_total`,
  `vllm:request_success_total{finished_reason}`, `vllm:time_to_first_token_seconds`,
  `vllm:inter_token_latency_seconds`, `vllm:e2e_request_latency_seconds` and
  `vllm:request_queue_time_seconds` (vLLM's buckets), `vllm:cache_config_info`. The
  scraper reads them with the same code as vLLM's (`placer/metrics_text.py`).
- `slowdown` stretches every duration (a slower GPU class in a heterogeneous pool).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .emulator_engine import Engine, Sequence, TimingModel

MAX_BODY_BYTES = 8 * 1024 * 1024
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
               1920.0, 7680.0)  # vLLM's, for end-to-end latency and queue time
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_WORDS = tuple(" the of and to in is that for it as with on be by this are from at or an".split())


@dataclass(frozen=True, slots=True)
class EmulatorSpec:
    """One emulated server: the model name it serves, the folder its tokenizer comes from
    (None: 4 bytes a token), its timing, a slowdown factor, where it listens."""

    name: str
    model_dir: Path | None = None
    timing: TimingModel = field(default_factory=TimingModel)  # defaults fitted to real vLLM here
    slowdown: float = 1.0
    host: str = "127.0.0.1"
    port: int = 0

    def scaled(self) -> TimingModel:
        if not 0.01 <= self.slowdown <= 1000:
            raise ValueError(f"slowdown {self.slowdown!r}: expected a factor in [0.01, 1000]")
        t = self.timing
        return replace(t, step_s=t.step_s * self.slowdown, prefill_s_per_token=t.prefill_s_per_token * self.slowdown,
                       decode_s_per_seq=t.decode_s_per_seq * self.slowdown)


class _Tokens:
    """Prompt tokens as the model's own tokenizer counts them (or 4 bytes a token)."""

    def __init__(self, model_dir: Path | None) -> None:
        self._tok = None
        path = model_dir / "tokenizer.json" if model_dir is not None else None
        if path is not None and path.is_file():
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> tuple[int, ...]:
        if self._tok is not None:
            return tuple(self._tok.encode(text, add_special_tokens=False).ids)
        data = text.encode()
        return tuple(int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4))

    def piece(self, seq_id: int, n: int) -> str:
        """The n-th output token's text (the emulator's output is filler; its timing is the point)."""
        return _WORDS[(seq_id * 31 + n * 7) % len(_WORDS)]


def _chatml(messages: list[Any]) -> str:
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _BadRequest("`messages`: each message is an object with a `role`", "messages")
        content = m.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise _BadRequest("`messages`: a message's `content` is a string or a list of text parts", "messages")
        out.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


class _BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def _error(e: _BadRequest) -> web.Response:
    kind = "NotFoundError" if e.status == 404 else "BadRequestError"
    return web.json_response({"error": {"message": str(e), "type": kind, "param": e.param, "code": e.status}}, status=e.status)


class _Instance:
    """One emulated server: its engine, its metrics, its routes."""

    def __init__(self, spec: EmulatorSpec) -> None:
        self.spec = spec
        self.timing = spec.scaled()
        self.tokens = _Tokens(spec.model_dir)
        self.registry = CollectorRegistry()
        labels = ["engine", "model_name"]
        lv = {"engine": "0", "model_name": spec.name}
        r = self.registry
        self.g_running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=r).labels(**lv)
        self.g_waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=r).labels(**lv)
        self.g_kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=r).labels(**lv)
        self.c = {name: Counter(f"vllm:{name}", doc, labels, registry=r).labels(**lv) for name, doc in (
            ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
            ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
            ("prompt_tokens", "Number of prefill tokens processed."),
            ("generation_tokens", "Number of generation tokens processed."),
            ("num_preemptions", "Cumulative number of preemption from the engine."))}
        self._counted = dict.fromkeys(self.c, 0)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels,
                              buckets=TTFT_BUCKETS, registry=r).labels(**lv)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels,
                             buckets=ITL_BUCKETS, registry=r).labels(**lv)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels,
                             buckets=E2E_BUCKETS, registry=r).labels(**lv)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                                    labels, buckets=E2E_BUCKETS, registry=r).labels(**lv)
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
              ["block_size", "enable_prefix_caching", "engine", "num_gpu_blocks"], registry=r).labels(
            block_size=str(self.timing.block_size), enable_prefix_caching="True", engine="0",
            num_gpu_blocks=str(self.timing.kv_blocks)).set(1)
        self.engine = Engine(self.timing, on_finish=self._finished, on_token=self._token)
        self._seq_ids = 0
        self._frontend = asyncio.Lock()  # vLLM's API server takes requests in one at a time

    # ------------------------------------------------------------------ engine callbacks
    def _token(self, s: Sequence, now: float) -> None:
        if s.first_token_at is None:
            self.ttft.observe(now - s.arrived)
        elif s.last_token_at is not None:
            self.itl.observe(now - s.last_token_at)

    def _finished(self, s: Sequence) -> None:
        self.success.labels(engine="0", model_name=self.spec.name, finished_reason=s.finished or "error").inc()
        if s.finished == "length":
            now = time.monotonic()
            self.e2e.observe(now - s.arrived)
            self.queue_time.observe((s.scheduled_at or now) - s.arrived)

    # ------------------------------------------------------------------ routes
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/metrics/", self.metrics)  # as vLLM: prometheus_client's app, `name[]` narrows the page
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        e = self.engine
        self.g_running.set(len(e.running))
        self.g_waiting.set(len(e.waiting))
        self.g_kv.set(e.kv_usage)
        for name, now in (("prefix_cache_queries", e.prefix_queries), ("prefix_cache_hits", e.prefix_hits),
                          ("prompt_tokens", e.prompt_tokens), ("generation_tokens", e.generation_tokens),
                          ("num_preemptions", e.preemptions)):
            if now > self._counted[name]:
                self.c[name].inc(now - self._counted[name])
                self._counted[name] = now
        names = request.query.getall("name[]", []) if request.path == "/metrics/" else []  # vLLM's `/metrics` ignores it
        registry = self.registry.restricted_registry(names) if names else self.registry
        return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")  # type: ignore[arg-type]

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.spec.name, "object": "model", "created": 0, "owned_by": "policyc-emulator", "root": self.spec.name,
            "max_model_len": self.timing.max_model_len}]})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _BadRequest(f"the body is over {MAX_BODY_BYTES:,} bytes", status=413) from None
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _BadRequest(f"the body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise _BadRequest("the body is not a JSON object")
        if body.get("model") != self.spec.name:
            raise _BadRequest(f"The model `{body.get('model')}` does not exist.", "model", status=404)
        return body

    def _max_tokens(self, body: dict[str, Any]) -> int:
        n = body.get("max_completion_tokens", body.get("max_tokens", 16))
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise _BadRequest("`max_tokens` is a positive integer", "max_tokens")
        return n

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest("`messages` is a non-empty list", "messages")
            prompt = self.tokens.encode(_chatml(messages))
            return await self._answer(request, body, prompt, chat=True)
        except _BadRequest as e:
            return _error(e)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            p = body.get("prompt")
            if isinstance(p, str):
                prompt = self.tokens.encode(p)
            elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                prompt = tuple(p)
            else:
                raise _BadRequest("`prompt` is a string or a list of token ids", "prompt")
            return await self._answer(request, body, prompt, chat=False)
        except _BadRequest as e:
            return _error(e)

    async def _answer(self, request: web.Request, body: dict[str, Any], prompt: tuple[int, ...], *, chat: bool) -> web.StreamResponse:
        if not prompt:
            raise _BadRequest("the prompt is empty", "prompt")
        max_tokens = self._max_tokens(body)
        arrived = time.monotonic()
        async with self._frontend:
            await asyncio.sleep(self.timing.frontend_s)
        seq = Sequence(prompt, max_tokens, arrived=arrived)
        try:
            self.engine.submit(seq)
        except ValueError as e:
            raise _BadRequest(f"This model's maximum context length is {self.timing.max_model_len} tokens: {e}",
                              "max_tokens") from None
        self._seq_ids += 1
        sid = self._seq_ids
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        created = int(time.time())
        try:
            if body.get("stream") is True:
                opts = body.get("stream_options")
                usage_too = isinstance(opts, dict) and opts.get("include_usage") is True
                return await self._stream(request, seq, sid, rid, created, chat, usage_too)
            return await self._whole(seq, sid, rid, created, chat)
        finally:
            self.engine.abort(seq)  # a client gone mid-answer (cancelled): stop generating; a no-op once finished

    def _usage(self, seq: Sequence) -> dict[str, int]:
        return {"prompt_tokens": len(seq.prompt), "completion_tokens": seq.generated,
                "total_tokens": len(seq.prompt) + seq.generated}

    async def _whole(self, seq: Sequence, sid: int, rid: str, created: int, chat: bool) -> web.Response:
        text = []
        while (n := await seq.out.get()) is not None:
            text.append(self.tokens.piece(sid, n))
        content = "".join(text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": seq.finished, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                                  "model": self.spec.name, "choices": [choice], "usage": self._usage(seq)})

    async def _stream(self, request: web.Request, seq: Sequence, sid: int, rid: str, created: int, chat: bool,
                      usage_too: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(obj: Any) -> None:
            await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

        role = chat  # vLLM sends the role chunk with its first output (after prefill), not at once
        while (n := await seq.out.get()) is not None:
            if role:
                await send({"id": rid, "object": kind, "created": created, "model": self.spec.name,
                            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
                role = False
            piece = self.tokens.piece(sid, n)
            last = n >= seq.max_tokens
            reason = "length" if last else None
            choice: dict[str, Any] = ({"index": 0, "delta": {"content": piece}, "finish_reason": reason} if chat
                                      else {"index": 0, "text": piece, "finish_reason": reason})
            await send({"id": rid, "object": kind, "created": created, "model": self.spec.name, "choices": [choice]})
        if usage_too:
            await send({"id": rid, "object": kind, "created": created, "model": self.spec.name, "choices": [],
                        "usage": self._usage(seq)})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


class EmulatorServer:
    """Emulated servers on one event loop in a thread of their own, each on its own port."""

    def __init__(self, specs: list[EmulatorSpec]) -> None:
        if not specs:
            raise ValueError("an emulator needs at least one server spec")
        self.specs = specs
        self.endpoints: list[str] = []
        self.startup_s: float | None = None
        self._instances: list[_Instance] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[web.AppRunner] = []
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> EmulatorServer:
        """Listen on every spec's port (0: the kernel picks); OSError when one cannot be bound."""
        t0 = time.monotonic()
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self._open())
            except BaseException as e:  # reported to start()'s caller
                self._error = e
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=run, name="policyc-emulator", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"the emulator did not listen within {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        self.startup_s = time.monotonic() - t0
        return self

    async def _open(self) -> None:
        for spec in self.specs:
            inst = _Instance(spec)
            inst.engine.start()
            runner = web.AppRunner(inst.app(), access_log=None, handle_signals=False, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, spec.host, spec.port)
            await site.start()
            port = runner.addresses[0][1]
            self._instances.append(inst)
            self._runners.append(runner)
            self.endpoints.append(f"{spec.host}:{port}")

    async def _close(self) -> None:
        for inst in self._instances:
            await inst.engine.stop()
        for runner in self._runners:
            await runner.cleanup()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(15)
        self._loop = self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> EmulatorServer:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["EmulatorServer", "EmulatorSpec", "TimingModel"]
