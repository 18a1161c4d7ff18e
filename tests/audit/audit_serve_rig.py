"""A real `policyc serve` with an audit log, a registered fleet and a client that records
every decision it got an answer for (a plain module: tests/ has no packages).

The client is what an auditor would trust: the decision ids the service acknowledged, and
when. Comparing them with the log after a fault counts the acknowledged-but-lost records.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from policyc.client import operator_channel
from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle
from policyc.placer import SimulatedCluster
from policyc.server import convert
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

HOSTS, GPUS = 8, 4
REQUESTS = [
    pb.DecideRequest(headers={"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"}),
    pb.DecideRequest(headers={"X-SLO-Latency": "150ms", "X-Data-Region": "us-west"}),
    pb.DecideRequest(headers={"X-Tenant": "shopwave", "X-Model": "fraud-scorer-lite", "X-Data-Region": "us-east"}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Serve:
    """A `policyc serve` subprocess on an ephemeral port."""

    proc: subprocess.Popen[str]
    port: int
    log: Path
    metrics_port: int
    stderr: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, bundle: Path, log: Path, *extra: str, bundle_obj: Bundle) -> Serve:
        metrics = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "policyc.cli.main", "serve", "--bundle", str(bundle), "--port", "0", "--audit-log", str(log),
             "--sim-hosts", str(HOSTS), "--sim-gpus-per-host", str(GPUS), "--enforcer", "off", "--metrics-port", str(metrics), *extra],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )
        assert proc.stderr is not None
        lines: list[str] = []
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                raise AssertionError(f"policyc serve exited ({proc.wait()}): {''.join(lines)}")
            lines.append(line)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        assert port is not None, lines
        serve = cls(proc, port, log, metrics, lines)
        threading.Thread(target=serve._drain, daemon=True).start()
        serve.register_fleet(bundle_obj)
        return serve

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def register_fleet(self, bundle: Bundle) -> None:
        slots = SimulatedCluster(1, HOSTS, GPUS, hosts_per_rack=4).gpu_slots()
        with operator_channel(f"127.0.0.1:{self.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for inst in admissible_fleet(bundle, slots):
                stub.RegisterInstance(convert.register_request(inst), timeout=10)

    def writer_pid(self) -> int:
        """The audit writer process (a child of the server)."""
        kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        for pid in kids:
            if "policyc.audit.writer_process" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return int(pid)
        raise AssertionError(f"no audit writer among the server's children {kids}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()


@dataclass
class Refusal:
    at: float  # time.monotonic() of the answer
    code: grpc.StatusCode
    details: str
    sent: float = 0.0  # time.monotonic() just before the call was made


class Client:
    """Threads calling Decide in a loop; every acknowledged decision id and when (monotonic)."""

    def __init__(self, port: int, threads: int = 6) -> None:
        self.acked: dict[str, float] = {}
        self.acked_sent: dict[str, float] = {}  # decision id -> when its call was made (monotonic)
        self.refusals: list[Refusal] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._channel = operator_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.DecisionsStub(self._channel)
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def _work(self, w: int) -> None:
        n = 0
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                d = self.stub.Decide(REQUESTS[(w + n) % len(REQUESTS)], timeout=5)
            except grpc.RpcError as e:
                with self._lock:
                    self.refusals.append(Refusal(time.monotonic(), e.code(), e.details() or "", sent))
                if e.code() is grpc.StatusCode.UNAVAILABLE and "audit log" not in (e.details() or ""):
                    return  # the server is gone
                time.sleep(0.002)
            else:
                now = time.monotonic()
                with self._lock:
                    self.acked[d.decision_id] = now
                    self.acked_sent[d.decision_id] = sent
            n += 1

    def wait_for(self, acks: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < acks:
            assert time.monotonic() < deadline, f"only {len(self.acked)} decisions acknowledged"
            time.sleep(0.01)

    def first_refusal_after(self, t: float, timeout: float = 5) -> Refusal:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                later = [r for r in self.refusals if r.at >= t]
            if later:
                return min(later, key=lambda r: r.at)
            time.sleep(0.001)
        raise AssertionError("no refusal")

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self._channel.close()


def logged_ids(log: Path) -> set[str]:
    with sqlite3.connect(f"{log.resolve().as_uri()}?mode=ro", uri=True) as db:
        return {r[0] for r in db.execute("SELECT decision_id FROM entries WHERE kind = 'decision'")}


def write_bundle(bundle: Bundle, path: Path) -> Path:
    bundle_io.write(bundle, path)
    return path
