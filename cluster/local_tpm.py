"""A software TPM (Debian `swtpm`) on loopback: one per simulated host, for tests and for
trying the agent out on one machine. `SoftwareTpm.start(root)` runs `swtpm socket` on two
consecutive free ports (commands, control) with its state under `root`; `tcti` is what tpm2-tools and
`HostTpm` take; `stop()` ends it. Nothing here is used by an agent on a real host."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .local_etcd import free_ports

SWTPM = os.environ.get("POLICYC_SWTPM", "/usr/bin/swtpm")


def _port_pair() -> tuple[int, int]:
    """Two consecutive free ports: the swtpm TCTI of tpm2-tools finds the control port at
    the command port + 1."""
    for _ in range(100):
        (port,) = free_ports(1)
        if port >= 65535:
            continue
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port, port + 1
    raise RuntimeError("no two consecutive free ports on 127.0.0.1 for swtpm")


@dataclass
class SoftwareTpm:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    netns: str = ""

    def _probe(self) -> None:
        """OSError until the command port accepts a connection (inside its namespace, if any)."""
        if not self.netns:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return
        probe = "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=0.5).close()"
        out = subprocess.run(["ip", "netns", "exec", self.netns, sys.executable, "-c", probe, str(self.port)],
                             capture_output=True, timeout=10)
        if out.returncode != 0:
            raise OSError(f"swtpm in {self.netns} does not listen yet")

    @property
    def tcti(self) -> str:
        return f"swtpm:host=127.0.0.1,port={self.port}"

    @classmethod
    def start(cls, root: Path | None = None, *, timeout: float = 10.0, netns: str = "") -> "SoftwareTpm":
        """`netns`: run it inside that network namespace (a host of a `NetnsFleet`), where
        its loopback ports are that host's own."""
        if not Path(SWTPM).exists():
            raise RuntimeError(f"swtpm is not installed at {SWTPM} (Debian: apt-get install swtpm swtpm-tools tpm2-tools)")
        base = Path(tempfile.mkdtemp(prefix="policyc-swtpm-", dir=root)).resolve()
        (base / "state").mkdir()
        port, ctrl = _port_pair()
        argv = [SWTPM, "socket", "--tpm2", "--tpmstate", f"dir={base / 'state'}",
                "--server", f"type=tcp,port={port},bindaddr=127.0.0.1", "--ctrl", f"type=tcp,port={ctrl},bindaddr=127.0.0.1",
                "--flags", "not-need-init,startup-clear"]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        with open(base / "swtpm.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        tpm = cls(base, port, proc, netns)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"swtpm exited {proc.returncode}: {(base / 'swtpm.log').read_text(errors='replace')[-300:]}")
            try:
                tpm._probe()
                return tpm
            except OSError:
                if time.monotonic() > deadline:
                    tpm.stop()
                    raise RuntimeError(f"swtpm did not listen on 127.0.0.1:{port} within {timeout:g} s") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)
