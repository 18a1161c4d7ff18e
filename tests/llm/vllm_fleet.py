"""Real vLLM servers for the LLM tests: at most two, started once per test session, in
parallel, through the product's own command (`policyc modelserver --engine vllm`), on the
project's own tiny model (`cached_llm_model`, made once in `.venv-vllm/models/tiny-llama`).

The fixture `vllm_servers` (tests/llm/conftest.py) hands out one `VllmFleet`:

    def test_chat(vllm_servers):
        url = vllm_servers.instances[0].base_url        # "http://127.0.0.1:40123/v1"
        vllm_servers.model                               # "tiny-llama" (the `model` in the body)
        vllm_servers.model_dir, vllm_servers.contract_path, vllm_servers.endpoints

Each instance is bound to its own core (`--cpu-bind 0` / `1`): vLLM takes a whole core
while it serves. Startup is about 70 s each on a quiet machine, both at once; the fixture
waits up to `START_TIMEOUT_S`. A missing `.venv-vllm` is a failure naming the fix, not a skip:
CI runs `scripts/setup.sh`, which installs it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from policyc.modelserver.llm_model import LlmModelError, cached_llm_model, vllm_python

START_TIMEOUT_S = 600.0
STOP_GRACE_S = 30.0
POLICYC = [sys.executable, "-m", "policyc.cli.main"]


@dataclass(frozen=True, slots=True)
class VllmInstance:
    instance_id: str
    endpoint: str  # "127.0.0.1:P": vLLM's HTTP/1.1 server (OpenAI routes, /health, /metrics)
    base_url: str  # "http://127.0.0.1:P/v1": the OpenAI client's base_url
    cpu: str  # the cores its OpenMP threads are bound to
    pid: int  # vLLM's API server


@dataclass(frozen=True, slots=True)
class VllmFleet:
    model: str  # the served model name: `model` in a request's body
    model_dir: Path  # weights, tokenizer (tokenizer.json), chat template, policyc.contract
    contract_path: Path
    instances: tuple[VllmInstance, ...]

    @property
    def endpoints(self) -> list[str]:
        return [i.endpoint for i in self.instances]


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _cores(n: int) -> list[str]:
    cores = sorted(os.sched_getaffinity(0))
    return [str(cores[i % len(cores)]) for i in range(n)] if len(cores) >= n else ["auto"] * n


class Launch:
    """The `policyc modelserver --engine vllm` processes of one session."""

    def __init__(self, workdir: Path, count: int = 2) -> None:
        self.workdir = workdir
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> VllmFleet:
        try:
            vllm_python()
        except LlmModelError as e:
            raise RuntimeError(f"the LLM tests need vLLM: {e}") from None
        model = cached_llm_model()
        cpus = _cores(self.count)
        ready = [self.workdir / f"vllm-{i}.ready.json" for i in range(self.count)]
        for i in range(self.count):  # spawned from this (the main) thread: PDEATHSIG follows it
            log = open(self.workdir / f"vllm-{i}.cli.log", "wb")
            with log:
                self.procs.append(subprocess.Popen(
                    [*POLICYC, "modelserver", "--engine", "vllm", "--model", str(model.dir), "--instance", f"{model.name}@vllm-{i}",
                     "--cpu-bind", cpus[i], "--ready-file", str(ready[i]), "--workdir", str(self.workdir / f"vllm-{i}")],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(r.exists() for r in ready):
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise RuntimeError(f"vLLM instance {i} exited with {p.returncode} before serving:\n{self.log_tail(i)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not serving after {START_TIMEOUT_S:.0f} s:\n"
                                   + "\n".join(self.log_tail(i) for i in range(self.count)))
            time.sleep(0.5)
        facts = [json.loads(r.read_text()) for r in ready]
        return VllmFleet(model=model.name, model_dir=model.dir, contract_path=model.contract_path,
                         instances=tuple(VllmInstance(f["instance"], f["endpoint"], f["base_url"], cpus[i], int(f["pid"]))
                                         for i, f in enumerate(facts)))

    def log_tail(self, i: int, lines: int = 40) -> str:
        out = []
        for path in (self.workdir / f"vllm-{i}.cli.log", self.workdir / f"vllm-{i}" / "vllm.log"):
            try:
                out.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
            except OSError:
                pass
        return "\n".join(out)

    def stop(self) -> list[int | None]:
        """SIGTERM to every command (each stops its vLLM), then SIGKILL after the grace."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for p in self.procs:
            try:
                codes.append(p.wait(STOP_GRACE_S))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc (parent pid -> child pids)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def engine_core_pids(fleet: VllmFleet) -> list[int]:
    """The processes under each instance's API server that make tokens: its `VLLM::EngineCore`
    (the scheduler) and the `VLLM::Worker` under it (the model runner). Both are held: with
    only the engine core stopped, the worker was seen to make all of a request's 900 tokens
    in one "10 ms" step."""
    kids, out = _children(), []
    for inst in fleet.instances:
        todo, cores, workers = [inst.pid], [], []
        while todo:
            for k in kids.get(todo.pop(), []):
                todo.append(k)
                try:
                    with open(f"/proc/{k}/comm") as f:
                        comm = f.read()
                except OSError:
                    continue
                if comm.startswith("VLLM::EngineCor"):
                    cores.append(k)
                elif comm.startswith("VLLM::Worker"):
                    workers.append(k)
        if len(cores) != 1:
            raise RuntimeError(f"vLLM {inst.instance_id} (pid {inst.pid}): engine core processes {cores}, not one")
        out += workers + cores
    return out


class EngineHold:
    """vLLM's engine cores stopped (SIGSTOP): no token is made while held, while the API
    servers (their HTTP, their /metrics) go on. vLLM makes the tiny model's 900 tokens in
    ~0.3 s, so on a loaded machine a request could end in vLLM before the gateway passed its
    first token; held, a stall is a real one, as long as the test needs."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def stop(self) -> None:
        for p in self.pids:
            os.kill(p, signal.SIGSTOP)

    def resume(self) -> None:
        for p in self.pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def step_until(self, done: Callable[[], bool], timeout: float = 120.0, pulse: float = 0.01) -> None:
        """Let the engines run `pulse` seconds at a time until `done()` (read while held)."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"vLLM's engines made nothing in {timeout:.0f} s of {pulse * 1e3:.0f} ms steps")
            self.resume()
            time.sleep(pulse)
            self.stop()
            time.sleep(0.1)  # the API server takes in what the engine made

    @staticmethod
    def settled(read: Callable[[], float], timeout: float = 10.0, quiet: float = 0.3) -> float:
        """`read()` once it has stopped moving for `quiet` seconds, while held. The API server takes
        in what the engines made on its own time: on a loaded machine a count read 0.1 s after a
        step was seen short of the 900 tokens that step had made."""
        deadline = time.monotonic() + timeout
        last = read()
        while time.monotonic() < deadline:
            time.sleep(quiet)
            now = read()
            if now == last:
                return now
            last = now
        return last


@contextmanager
def held_engines(fleet: VllmFleet) -> Iterator[EngineHold]:
    """The fleet's engine cores held for the block (always let go after it, even on failure)."""
    hold = EngineHold(engine_core_pids(fleet))
    hold.stop()
    try:
        yield hold
    finally:
        hold.resume()
