"""Real etcd members on loopback: a throw-away cluster for tests, benchmarks and trying
replicas out on one machine (`policyc cluster` reads it like any other).

Each member gets free client and peer ports and its own data directory under one temp
dir; `kill(name)` ends one member the way a crash would (SIGKILL), `restart(name)` brings
it back on the same ports and data, `pause`/`resume` stop and continue it (SIGSTOP/SIGCONT). Nothing here is used by a replica itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ETCD = os.environ.get("POLICYC_ETCD", "/usr/bin/etcd")


def free_ports(n: int) -> list[int]:
    """`n` distinct ports the kernel says are free now (bound, read, released together)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass
class LocalEtcd:
    """`with LocalEtcd.start(3) as etcd: etcd.endpoints` — a healthy cluster or an error."""

    members: list[Member]
    root: Path
    cluster_token: str
    _log: list[Path] = field(default_factory=list)
    also_listen: str = ""

    @classmethod
    def start(cls, size: int = 3, *, timeout: float = 15.0, root: Path | None = None, also_listen: str = "") -> "LocalEtcd":
        """`also_listen`: one more address each member's client port listens on (e.g. a
        bridge's, for agents in network namespaces)."""
        if not Path(ETCD).exists():
            raise RuntimeError(f"etcd is not installed at {ETCD} (Debian: apt-get install etcd-server)")
        base = Path(tempfile.mkdtemp(prefix="policyc-etcd-", dir=root))
        ports = free_ports(2 * size)
        members = [Member(f"m{i}", ports[2 * i], ports[2 * i + 1], base / f"m{i}") for i in range(size)]
        etcd = cls(members, base, f"policyc-{os.getpid()}-{ports[0]}", also_listen=also_listen)
        for m in members:
            etcd._launch(m, initial=True)
        etcd.wait_healthy(timeout)
        return etcd

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def _launch(self, m: Member, *, initial: bool) -> None:
        peers = ",".join(f"{x.name}=http://127.0.0.1:{x.peer_port}" for x in self.members)
        argv = [ETCD, "--name", m.name, "--data-dir", str(m.data_dir),
                "--listen-client-urls", f"http://127.0.0.1:{m.client_port}"
                + (f",http://{self.also_listen}:{m.client_port}" if self.also_listen else ""),
                "--advertise-client-urls", f"http://127.0.0.1:{m.client_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{m.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{m.peer_port}",
                "--initial-cluster", peers, "--initial-cluster-token", self.cluster_token,
                "--initial-cluster-state", "new" if initial else "existing",
                # loopback: short heartbeats make a leader's death noticed (and an election held) fast
                "--heartbeat-interval", "50", "--election-timeout", "500",
                "--logger", "zap", "--log-level", "error"]
        log = self.root / f"{m.name}.log"
        self._log.append(log)
        with open(log, "ab") as out:
            m.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout: float = 15.0) -> None:
        """Every running member answers `endpoint health` (raft has a leader)."""
        deadline = time.monotonic() + timeout
        live = [m for m in self.members if m.proc is not None and m.proc.poll() is None]
        while True:
            if all(self._healthy(m) for m in live):
                return
            for m in live:
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"etcd member {m.name} exited {m.proc.returncode}: {self._tail(m)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd cluster not healthy after {timeout:g} s: {self._tail(live[0])}")
            time.sleep(0.05)

    def _healthy(self, m: Member) -> bool:
        out = subprocess.run(["etcdctl", "--endpoints", m.endpoint, "--command-timeout=1s", "endpoint", "health"],
                             capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
        return out.returncode == 0

    def _tail(self, m: Member) -> str:
        try:
            return (self.root / f"{m.name}.log").read_text(errors="replace")[-400:]
        except OSError:
            return "(no log)"

    def leader(self) -> Member:
        """The member raft currently has as leader."""
        out = subprocess.run(["etcdctl", "--endpoints", ",".join(m.endpoint for m in self.members if self.running(m)),
                              "--command-timeout=2s", "endpoint", "status", "-w", "json"],
                             capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
        import json

        for st in json.loads(out.stdout or "[]"):
            if st["Status"]["header"]["member_id"] == st["Status"]["leader"]:
                port = int(st["Endpoint"].rpartition(":")[2])
                return next(m for m in self.members if m.client_port == port)
        raise RuntimeError(f"no etcd leader: {out.stderr.strip()}")

    def running(self, m: Member) -> bool:
        return m.proc is not None and m.proc.poll() is None

    def kill(self, m: Member) -> None:
        """SIGKILL, as a crash: no goodbye to the rest of raft."""
        if m.proc is not None and m.proc.poll() is None:
            os.killpg(m.proc.pid, signal.SIGKILL)
            m.proc.wait(10)

    def pause(self, m: Member) -> None:
        """SIGSTOP: the member stops answering but keeps its connections (a hung host, a
        partition): requests sent to it wait in its socket buffers."""
        if m.proc is not None and m.proc.poll() is None:
            os.killpg(m.proc.pid, signal.SIGSTOP)

    def resume(self, m: Member) -> None:
        """SIGCONT: it reads what waited for it and rejoins raft."""
        if m.proc is not None and m.proc.poll() is None:
            os.killpg(m.proc.pid, signal.SIGCONT)

    def restart(self, m: Member, timeout: float = 15.0) -> None:
        self.kill(m)
        self._launch(m, initial=False)
        self.wait_healthy(timeout)

    def stop(self) -> None:
        for m in self.members:
            self.resume(m)
            self.kill(m)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalEtcd":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
