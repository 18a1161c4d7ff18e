"""Start real KServe model-server processes on loopback, wait until they serve, stop them.

    files = write_model_files(bundle.contract("fraud-scorer"), workdir)
    spec = ServerSpec((InstanceSpec("fraud-scorer@host-01/gpu0", files.full),))
    with ModelPool([spec, backup_spec]).start() as pool:
        pool.endpoint("fraud-scorer@host-01/gpu0")   # "127.0.0.1:40123", its OIP gRPC server

Each `ServerSpec` is one process (`python -m policyc.modelserver`), serving one or more
instances (replicas of one model too), each on its own gRPC port — its endpoint, what a
gateway steers to; the process's one REST port serves the model names exactly one of its
instances answers. A process costs about a second of CPU to start (importing KServe), so
put several instances in one process where isolation does not matter. Ports are picked by
the kernel (port 0) and read back from the process's ready file, so parallel sessions
never race for a port. `ModelPool.start` spawns every process first and then waits for all, so
a pool starts in about the time of its slowest process. Ready means: the process wrote its
ready file, and `ServerReady` and `ModelReady` (every served name) answer true over gRPC.

Processes are stopped with SIGTERM (then SIGKILL after a grace period); a pool that is
garbage collected or left running at interpreter exit is stopped too, so no test leaves a
server behind.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import grpc

from . import cgroup_place
from .forked import Forked
from .oip import InferenceStub, pb
from .specs import InstanceSpec, ServerSpec, ServingInstance

__all__ = ["InstanceSpec", "ModelPool", "ModelServerError", "ModelServerProcess", "ServerSpec", "ServingInstance"]

STOP_GRACE_S = 5.0


class ModelServerError(RuntimeError):
    """A model-server process did not start, did not become ready, or died."""


_live: "weakref.WeakSet[ModelServerProcess]" = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for p in list(_live):
        p.stop()


class ModelServerProcess:
    """One model-server process: `python -m policyc.modelserver` of its own (`spawn`), or
    forked by its pool's zygote."""

    def __init__(self, spec: ServerSpec, workdir: Path) -> None:
        if not spec.instances:
            raise ValueError("a model server needs at least one instance")
        self.spec = spec
        self.workdir = workdir
        self.ready_file = workdir / "ready.json"
        self.log_path = workdir / "server.log"
        self._proc: subprocess.Popen[bytes] | Forked | None = None
        self._facts: dict[str, object] | None = None
        self.instances: list[ServingInstance] = []
        self.startup_s: float | None = None
        self._started_at = 0.0
        self._terminated = False
        self.cgroup: Path | None = None  # its own cgroup v2 (cgroup_place): the kernel's count of its CPU

    # ------------------------------------------------------------------ life cycle
    def spawn(self) -> None:
        """Start the process; returns at once (see `wait_ready`)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        self._terminated = False
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        with open(self.log_path, "wb") as log:
            self._started_at = time.monotonic()
            self._proc = subprocess.Popen(self.spec.argv(self.ready_file), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=env)
        _live.add(self)
        weakref.finalize(self, _kill, self._proc)

    def _forked(self, zygote: subprocess.Popen[bytes]) -> None:
        """Adopt the child the zygote forks for this server."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for stale in ("ready.json", "pid", "exit"):
            (self.workdir / stale).unlink(missing_ok=True)
        self._terminated = False
        self._started_at = time.monotonic()
        self._proc = Forked(self.workdir, zygote)
        _live.add(self)
        weakref.finalize(self, _kill, self._proc)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the process serves every instance; ModelServerError (with its log) if not."""
        if self._proc is None:
            raise ModelServerError("wait_ready before spawn")
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self._proc.poll() is not None:
                raise ModelServerError(f"model server exited with {self._proc.returncode} before serving:\n"
                                       + self.log_tail())
            if time.monotonic() > deadline:
                raise ModelServerError(f"model server not serving after {timeout:.0f} s:\n" + self.log_tail())
            time.sleep(0.02)
        self._facts = json.loads(self.ready_file.read_text())
        if self.cgroup is None and self.pid is not None:
            self.cgroup = cgroup_place.place(self.pid)
        self._check_ready(deadline)
        self.startup_s = time.monotonic() - self._started_at
        self.instances = self._serving()

    def _check_ready(self, deadline: float) -> None:
        for inst in self._instance_facts():
            names = [str(inst["model"]), *inst["aliases"]]  # type: ignore[misc]
            endpoint = f"{self._fact('host')}:{inst['grpc_port']}"
            with grpc.insecure_channel(endpoint) as channel:
                stub = InferenceStub(channel)
                while True:
                    try:
                        left = max(0.1, deadline - time.monotonic())
                        if stub.ServerReady(pb.ServerReadyRequest(), timeout=left).ready and all(
                                stub.ModelReady(pb.ModelReadyRequest(name=n), timeout=left).ready for n in names):
                            break
                    except grpc.RpcError as e:
                        if time.monotonic() > deadline:
                            raise ModelServerError(f"model server at {endpoint} not ready: {e.code().name} "
                                                   f"{e.details()}\n" + self.log_tail()) from None
                    if time.monotonic() > deadline:
                        raise ModelServerError(f"model server at {endpoint} reports not ready\n" + self.log_tail())
                    time.sleep(0.02)

    def terminate(self) -> None:
        """Send SIGTERM once (a second one could land while Python finalises, when the
        default handler is back, and turn a clean exit into a kill)."""
        if self._proc is not None and self._proc.poll() is None and not self._terminated:
            self._terminated = True
            self._proc.send_signal(signal.SIGTERM)

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; the exit status (None if never started)."""
        proc = self._proc
        if proc is None:
            return None
        _live.discard(self)
        self.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        cgroup_place.release(self.cgroup)
        self.cgroup = None
        return proc.returncode

    def __enter__(self) -> ModelServerProcess:
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

    def _fact(self, key: str) -> object:
        if self._facts is None:
            raise ModelServerError("the model server is not ready yet")
        return self._facts[key]

    @property
    def http_endpoint(self) -> str:
        """host:port of the process's OIP v2 REST server (every instance, by model name)."""
        return f"{self._fact('host')}:{self._fact('http_port')}"

    def _instance_facts(self) -> list[dict[str, object]]:
        return self._fact("instances")  # type: ignore[return-value]

    def _serving(self) -> list[ServingInstance]:
        by_id = {i.instance_id: i for i in self.spec.instances}
        out: list[ServingInstance] = []
        for facts in self._instance_facts():
            iid = str(facts["instance"])
            spec = by_id.get(iid)
            if spec is None:
                raise ModelServerError(f"model server serves instance `{iid}`, which its spec does not name")
            out.append(ServingInstance(
                instance_id=iid, model=str(facts["model"]), contract=str(facts["contract"]),
                endpoint=f"{self._fact('host')}:{facts['grpc_port']}", http_endpoint=self.http_endpoint,
                model_path=spec.model, variants=tuple(facts["variants"]),  # type: ignore[arg-type]
                aliases=tuple(facts["aliases"]),  # type: ignore[arg-type]
                on_rest=str(facts["model"]) in self._fact("rest_models")))  # type: ignore[operator]
        return out

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _kill(proc: subprocess.Popen[bytes] | Forked) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(STOP_GRACE_S)


@dataclass
class ModelPool:
    """Several model-server processes started together (in parallel) and stopped together."""

    servers: Sequence[ServerSpec]
    workdir: Path | None = None
    fork: bool = True  # several processes: fork them from one zygote that imported KServe once
    processes: list[ModelServerProcess] = field(default_factory=list, init=False)
    startup_s: float | None = field(default=None, init=False)
    _own_dir: bool = field(default=False, init=False)
    _zygote: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self, timeout: float = 30.0) -> ModelPool:
        """Spawn every process, then wait for all; on any failure stop them all and raise."""
        if self.processes:
            raise ModelServerError("the pool is already started")
        ids = [i.instance_id for s in self.servers for i in s.instances]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"instance ids given twice: {', '.join(dupes)}")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="policyc-modelpool-"))
            self._own_dir = True
        t = time.monotonic()
        self.processes = [ModelServerProcess(s, self.workdir / f"server-{n}") for n, s in enumerate(self.servers)]
        cgroup_place.reap_stale()  # the cgroups of servers a killed run left behind
        try:
            if self.fork and len(self.processes) > 1:
                self._start_zygote()
            else:
                for p in self.processes:
                    p.spawn()
            for p in self.processes:
                p.wait_ready(max(1.0, timeout - (time.monotonic() - t)))
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t
        return self

    def _start_zygote(self) -> None:
        assert self.workdir is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        spec_path = self.workdir / "zygote.json"
        spec_path.write_text(json.dumps([{"argv": p.spec.argv(p.ready_file)[3:], "workdir": str(p.workdir)}
                                         for p in self.processes]))
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        with open(self.workdir / "zygote.log", "wb") as log:
            self._zygote = subprocess.Popen([sys.executable, "-m", "policyc.modelserver.zygote", str(spec_path)],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        weakref.finalize(self, _kill, self._zygote)
        for p in self.processes:
            p._forked(self._zygote)

    @property
    def instances(self) -> list[ServingInstance]:
        return [i for p in self.processes for i in p.instances]

    def instance(self, instance_id: str) -> ServingInstance:
        for i in self.instances:
            if i.instance_id == instance_id:
                return i
        raise KeyError(f"no instance `{instance_id}` in the pool")

    def endpoint(self, instance_id: str) -> str:
        """host:port of the OIP gRPC server serving `instance_id`."""
        return self.instance(instance_id).endpoint

    def process_of(self, instance_id: str) -> ModelServerProcess:
        for p in self.processes:
            if any(i.instance_id == instance_id for i in p.instances):
                return p
        raise KeyError(f"no instance `{instance_id}` in the pool")

    def stop(self) -> None:
        """Stop every process (in parallel: SIGTERM to all, then wait); keeps no directory it made."""
        for p in self.processes:
            p.terminate()
        for p in self.processes:
            p.stop()
        if self._zygote is not None:  # it exits once it has reaped every child
            try:
                self._zygote.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait()
        if self._own_dir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __iter__(self) -> Iterator[ServingInstance]:
        return iter(self.instances)

    def __enter__(self) -> ModelPool:
        if not self.processes:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
