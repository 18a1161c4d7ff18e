"""What the picker adds to an LLM request's time to first token, against Envoy's own
round-robin to the same vLLM instances, in the same run.

Two real vLLM servers (`policyc modelserver --engine vllm`, the project's tiny model, one
core each) behind two Envoys:

- **policyc**: the gateway as `policyc gateway` builds it (the picker reading the body,
  counting the prompt with the model's tokenizer, deciding; the stream supervisor holding
  each answer's headers to its first token);
- **round-robin**: Envoy alone, HTTP/1.1 to the same two servers, no picker.

Each request is a streamed chat completion with `max_tokens: 1`; its TTFT is measured at the
client, from sending the request to the first `data:` event. Prompt sizes: 1 KB and 220 KB
(the Inference Extension's picker was reported going from 158 ms to 1,141 ms TTFT at 220 KB
under concurrency); concurrency 1 and 32. The tiny model's context is 1,024 tokens (its
position embeddings: vLLM refuses a longer `--max-model-len`), so a 220 KB prompt cannot be
served: vLLM answers it 400 at once. At 220 KB the figure is therefore the time to the 400
through each gateway — what the gateway itself adds on a 220 KB body, not a TTFT — twice:
`checked`, the picker with the model's context (the body's bytes already exceed it in tokens:
refused without tokenizing), and `counted`, the context check lifted so the picker reads and
tokenizes all 220 KB before forwarding. Every request's prompt is distinct (a number first),
so neither vLLM's prefix cache nor the picker's per-text count cache flatters a figure.
Printed: p50 / p90 per gateway, the p50 the picker adds (ms and %), the machine's load.
`--quick`: fewer requests and concurrency 1 and 8.

    .venv/bin/python benchmarks/llm_gateway.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO / "tests" / "gateway"))

from gateway_rig import free_port  # noqa: E402
from llm_rig import start_llm_gateway  # noqa: E402

from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap  # noqa: E402
from policyc.gateway.envoy_process import EnvoyProcess  # noqa: E402
from policyc.modelserver.llm_model import cached_llm_model  # noqa: E402

POLICYC = [sys.executable, "-m", "policyc.cli.main"]
MAX_MODEL_LEN = 1024


def start_vllm(workdir: Path, n: int = 2) -> tuple[list[subprocess.Popen[bytes]], list[str], object]:
    model = cached_llm_model()
    cores = sorted(os.sched_getaffinity(0))
    procs, ready = [], [workdir / f"vllm-{i}.ready.json" for i in range(n)]
    for i in range(n):
        log = open(workdir / f"vllm-{i}.log", "wb")
        procs.append(subprocess.Popen([*POLICYC, "modelserver", "--engine", "vllm", "--model", str(model.dir),
                                       "--instance", f"{model.name}@bench-{i}", "--cpu-bind", str(cores[i % len(cores)]),
                                       "--max-model-len", str(MAX_MODEL_LEN), "--ready-file", str(ready[i]),
                                       "--workdir", str(workdir / f"vllm-{i}")],
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 600
    while not all(r.exists() for r in ready):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise SystemExit(f"vLLM did not start: see {workdir}")
        time.sleep(0.5)
    return procs, [json.loads(r.read_text())["endpoint"] for r in ready], model


def round_robin(endpoints: list[str], workdir: Path) -> tuple[EnvoyProcess, str]:
    """Envoy alone: HTTP/1.1 round-robin to the same servers."""
    listen = f"127.0.0.1:{free_port()}"
    boot = build_bootstrap(GatewaySpec(picker="127.0.0.1:1", listen=listen, admin=f"127.0.0.1:{free_port()}",
                                       endpoints=tuple(endpoints), use_picker=False))
    pool = boot["static_resources"]["clusters"][0]
    opts = pool["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    opts["explicit_http_config"] = {"http_protocol_options": {}}
    return EnvoyProcess(boot, workdir).start(), listen


def ttft(listen: str, body: bytes, first_event: bool = True) -> float:
    host, port = listen.split(":")
    with socket.create_connection((host, int(port)), timeout=300) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                  # budgets out of the way: this measures the path, not a break
                  b"x-slo-ttft-ms: 600000\r\nx-slo-tpot-ms: 600000\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while (b"data: " not in got) if first_event else (b"\r\n\r\n" not in got):
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"no event: {got[:300]!r}")
            got += chunk
        took = time.perf_counter() - t0
        if not got.startswith(b"HTTP/1.1 200" if first_event else b"HTTP/1.1 400"):
            raise RuntimeError(got[:300].decode("latin-1"))
        if not first_event:
            return took
        while not got.endswith(b"0\r\n\r\n"):  # read the stream to its end (max_tokens 1: a few events)
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return took


def run(listen: str, make: "Callable[[int], bytes]", n: int, concurrency: int, first_event: bool = True) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()
    left = [n]
    seq = [0]

    def worker() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
                seq[0] += 1
                i = seq[0]
            t = ttft(listen, make(i), first_event)
            with lock:
                out.append(t)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def prompt_of(size: int) -> str:
    words = (REPO / "gateway" / "picker.py").read_text().split()
    text, i = [], 0
    while sum(len(w) + 1 for w in text) < size:
        text.append(words[i % len(words)])
        i += 1
    return " ".join(text)[:size]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=0, help="requests per configuration (default 64, --quick 16)")
    args = ap.parse_args()
    n = args.requests or (16 if args.quick else 64)
    concurrencies = (1, 8) if args.quick else (1, 32)
    workdir = Path(tempfile.mkdtemp(prefix="policyc-bench-llm-"))
    procs, endpoints, model = start_vllm(workdir)
    gw = envoy = None
    try:
        gw = start_llm_gateway(tokenizer=model.dir, contracts=(model.contract_path,),  # type: ignore[attr-defined]
                               contexts={model.name: 10**8},  # type: ignore[attr-defined]  # the picker reads all 220 KB
                               served=[(model.name, e) for e in endpoints])  # type: ignore[attr-defined]
        envoy, rr = round_robin(endpoints, workdir / "rr")
        print(f"vLLM x2 ({', '.join(endpoints)}), tiny-llama (context {MAX_MODEL_LEN}); {n} requests each; "
              f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"{'prompt':>8} {'conc':>4} | {'round-robin p50/p90 ms':>22} | {'policyc p50/p90 ms':>18} | added p50")
        for size, mode in ((1024, ""), (220 * 1024, "checked"), (220 * 1024, "counted")):
            text = prompt_of(size)
            served = not mode  # over the context: the 400, timed to its status line
            if mode == "counted":
                gw.picks.contexts[model.name] = 10**8  # type: ignore[attr-defined]  # the picker tokenizes it all
            else:
                gw.picks.contexts.pop(model.name, None)  # type: ignore[attr-defined]

            def make(i: int, text: str = text, tag: str = mode or "s") -> bytes:
                return json.dumps({"model": model.name, "max_tokens": 1, "stream": True,  # type: ignore[attr-defined]
                                   "messages": [{"role": "user", "content": f"{tag}{i} {text}"}]}).encode()

            for c in concurrencies:
                run(rr, lambda i: make(-i), min(4, n), 1, served)  # warm: connections
                run(gw.listen, lambda i: make(-i), min(4, n), 1, served)
                base = run(rr, lambda i: make(10_000 * c + i), n, c, served)
                ours = run(gw.listen, lambda i: make(20_000 * c + i), n, c, served)
                bp, op = statistics.median(base) * 1e3, statistics.median(ours) * 1e3
                b90 = statistics.quantiles(base, n=10)[-1] * 1e3
                o90 = statistics.quantiles(ours, n=10)[-1] * 1e3
                print(f"{size // 1024:>6}KB {c:>4} | {bp:>10.1f} / {b90:>9.1f} | {op:>8.1f} / {o90:>7.1f} | "
                      f"{op - bp:+.1f} ms ({(op - bp) / bp * 100:+.1f} %){'' if served else f'  (to the 400, {mode})'}",
                      flush=True)
    finally:
        for stop in ((lambda: envoy.stop()) if envoy else None, (lambda: gw.stop()) if gw else None):
            if stop is not None:
                try:
                    stop()
                except Exception:  # noqa: BLE001 - stop everything started
                    pass
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
