"""A real `policyc gateway` process on fixed ports with a state dir, a real model server
registered through it, and what a restart needs measured: `kill -9` it, check that none of
its children outlives it, start it again on the same ports and time until a request through
Envoy is answered (with the registry it had: nothing is registered again). Used by
`test_gateway_restart.py` and `benchmarks/gateway_restart.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from policyc.client.bearer import with_token
from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle
from policyc.gateway.envoy_process import PID_FILE, process_gone
from policyc.matcher.instance import Instance
from policyc.modelserver.client import OipClient, token_ids
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
from policyc.modelserver.model_files import write_model_files
from policyc.server import convert
from policyc.server.proto import pb_grpc

from gateway_rig import PRIMARY, free_port

POLICYC = [sys.executable, "-m", "policyc.cli.main"]
OPERATOR = "restart-rig-operator-token"
INSTANCE = "fraud-scorer@host-0002/gpu0"
METADATA = (("x-model", PRIMARY), ("x-tenant", "acme-bank"))


def children(pid: int) -> dict[int, str]:
    """The live processes whose parent is `pid`, with their command lines."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            ppid = int(stat.rpartition(")")[2].split()[1])
            if ppid == pid and not process_gone(int(proc.name)):
                out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
    return out


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds `pid` has used (its reaped children's included), or 0.0 when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


@dataclass
class GatewayProcess:
    bundle: Bundle
    workdir: Path
    extra: tuple[str, ...] = ()
    api: int = field(default_factory=free_port)
    listen: int = field(default_factory=free_port)
    admin: int = field(default_factory=free_port)
    picker: int = field(default_factory=free_port)
    proc: subprocess.Popen[str] | None = None
    models: ModelPool | None = None

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def envoy_pid_file(self) -> Path:
        return self.state_dir / "gateway" / PID_FILE

    def argv(self) -> list[str]:
        path = self.workdir / "bundle.json"
        if not path.exists():
            bundle_io.write(self.bundle, path)
        return POLICYC + ["gateway", "--bundle", str(path), "--port", str(self.api), "--listen", f"127.0.0.1:{self.listen}",
                          "--admin", f"127.0.0.1:{self.admin}", "--picker-port", str(self.picker),
                          "--state-dir", str(self.state_dir), "--token", f"operator:{OPERATOR}", *self.extra]

    def start(self) -> float:
        """Launch the gateway process; the monotonic time it was launched."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        return t0

    def start_models(self) -> None:
        files = write_model_files(self.bundle.contract(PRIMARY), self.workdir / "models")  # type: ignore[arg-type]
        self.models = ModelPool([ServerSpec((InstanceSpec(INSTANCE, files.full),))],
                                workdir=self.workdir / "servers").start(timeout=60)
        self._model_bytes = files.full.read_bytes()

    def register(self, timeout: float = 60.0) -> None:
        """RegisterInstance the model server, with its endpoint, on the gateway's decision API."""
        assert self.models is not None
        from policyc.placer import SimulatedCluster
        from policyc.server.config import ClusterSpec

        c = ClusterSpec()
        slots = SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack).gpu_slots()
        d = next(s.to_deployment() for s in slots if s.host == "host-0002" and s.gpu == "gpu0")
        inst = Instance(id=INSTANCE, model=PRIMARY, deployment=d.model_copy(update={"endpoint": self.models.endpoint(INSTANCE)}))
        with with_token(grpc.insecure_channel(f"127.0.0.1:{self.api}"), OPERATOR) as ch:
            grpc.channel_ready_future(ch).result(timeout=timeout)
            try:
                pb_grpc.DecisionsStub(ch).RegisterInstance(convert.register_request(inst, onnx_model=self._model_bytes),
                                                           timeout=10)
            except grpc.RpcError:
                # a port picked free and bound later can be taken meanwhile: then the gateway has said so and exited
                if self.proc is not None and self.proc.poll() is not None:
                    raise AssertionError(f"the gateway exited {self.proc.returncode}: "
                                         f"{self.proc.stderr.read()[-2000:]}") from None  # type: ignore[union-attr]
                raise

    def serving(self, since: float, timeout: float = 60.0) -> float:
        """Seconds from `since` until a request through Envoy is answered by the registered
        instance (AssertionError with the last refusal, or the process's end, otherwise)."""
        deadline, last = time.monotonic() + timeout, ""
        with OipClient(f"127.0.0.1:{self.listen}") as c:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"the gateway exited {self.proc.returncode}: {self.proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
                try:
                    answer = c.infer(PRIMARY, token_ids(16), timeout=2, metadata=METADATA)
                    assert answer.instance == INSTANCE, answer
                    return time.monotonic() - since
                except grpc.RpcError as e:
                    last = f"{e.code()}: {e.details()}"
                time.sleep(0.02)
        raise AssertionError(f"not serving within {timeout:g} s: {last}")

    def kill9(self) -> dict[int, str]:
        """`kill -9` the gateway; the children it had (pid → command line)."""
        assert self.proc is not None
        kids = children(self.proc.pid)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc.stderr.close()  # type: ignore[union-attr]
        return kids

    def stop(self) -> tuple[int, str]:
        """SIGTERM; its exit status and standard error."""
        assert self.proc is not None
        if self.proc.poll() is None:  # the gateway alone: it stops its children in order (the audit writer last)
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.models is not None:
            self.models.stop()


def survivors(kids: dict[int, str], timeout: float = 15.0) -> dict[int, str]:
    """Those of `kids` still running `timeout` seconds after their parent died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {pid: cmd for pid, cmd in kids.items() if not process_gone(pid)}
        if not alive:
            return {}
        time.sleep(0.02)
    return alive
