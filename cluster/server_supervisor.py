"""The model servers a host agent starts and keeps running: each one started pinned where
its placement plan says (`server_pinning.py`), watched, and started again when it exits
without being asked to (a crash), after a back-off that doubles while it keeps crashing
(0.5 s up to 10 s; back to 0.5 s once it has run 30 s). Its pid is handed to the agent's
collector at every start, so its CPU, RSS and run-queue delay are measured under its name,
and the agent registers its instance while it runs (`on_pid` / `on_exit`: deregistered
while it is down, so nothing is placed on a dead server).

    sup = ServerSupervisor([ServerSpec("onnx-0", argv, Pin.of_plan(plan))], on_pid=collector.processes.__setitem__)
    await sup.start()          # PinError: a plan this host cannot honour; OSError: argv not runnable
    sup.status()["onnx-0"]     # pid, restarts, last exit, the pin and how memory is bound
    await sup.restart("onnx-0")   # the leader's `restart_server` act
    await sup.stop()
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from policyc.matcher import Instance

from .server_pinning import Pin, Pinning, prepare

log = logging.getLogger("policyc.agent")
BACKOFF_S, MAX_BACKOFF_S, STEADY_S = 0.5, 10.0, 30.0
STOP_GRACE_S = 10.0
POLL_S = 0.1


@dataclass(frozen=True)
class ServerSpec:
    name: str
    argv: tuple[str, ...]
    pin: Pin
    env: Mapping[str, str] = field(default_factory=dict)  # added to the agent's environment
    instance: Instance | None = None  # registered by the agent while the server runs (its endpoint on this host)

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 64 or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"model server name `{self.name[:80]}`: 1-64 letters, digits, `-`, `_`, `.`")
        if not self.argv:
            raise ValueError(f"model server `{self.name}`: no command to run")
        if shutil.which(self.argv[0], path=self.env.get("PATH")) is None:  # found now, not as a crash loop later
            raise ValueError(f"model server `{self.name}`: `{self.argv[0]}` is not an executable on the PATH")


@dataclass
class _Running:
    spec: ServerSpec
    pinning: Pinning
    proc: "subprocess.Popen[bytes] | None" = None
    started_at: float = 0.0
    restarts: int = 0
    last_exit: int | None = None
    backoff: float = BACKOFF_S
    due: float | None = None  # monotonic time of the next start after a crash
    stopping: bool = False
    memory: str = ""  # how its memory is bound, as checked at its last start


class ServerSupervisor:
    def __init__(self, specs: Sequence[ServerSpec], *, on_pid: Callable[[str, int], None] | None = None,
                 on_exit: Callable[[str, int], None] | None = None, log_dir: Path | None = None) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"model servers: a name given twice ({', '.join(sorted(n for n in set(names) if names.count(n) > 1))})")
        self.specs = tuple(specs)
        self._on_pid, self._on_exit, self._log_dir = on_pid, on_exit, log_dir
        self._servers: dict[str, _Running] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start every server pinned; PinError names a plan this host cannot honour."""
        try:
            for spec in self.specs:
                self._servers[spec.name] = _Running(spec, prepare(spec.pin, spec.name))
            for r in self._servers.values():
                await asyncio.to_thread(self._spawn, r)
        except BaseException:
            await self.stop()  # none left running, no cgroup left behind
            raise
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def _spawn(self, r: _Running) -> None:
        out: Any = subprocess.DEVNULL
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self._log_dir / f"{r.spec.name}.log", "ab")
        try:
            r.proc = subprocess.Popen(r.pinning.argv(r.spec.argv), env={**os.environ, **r.spec.env}, stdin=subprocess.DEVNULL,
                                      stdout=out, stderr=subprocess.STDOUT if out is not subprocess.DEVNULL else None,
                                      start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        r.started_at, r.due = time.monotonic(), None
        r.memory = r.pinning.memory
        deadline = time.monotonic() + 5.0  # past the wrapper (pinned) before it is reported started, measured, registered
        while not r.pinning.pinned(r.proc.pid) and r.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if r.pinning.cgroup is not None:  # the wrapper joins the cgroup before it execs: see that it did
            deadline = time.monotonic() + 2.0
            while not r.pinning.in_cgroup(r.proc.pid) and r.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            if not r.pinning.in_cgroup(r.proc.pid):
                r.memory = f"not bound: the server did not join {r.pinning.cgroup} (CPUs by sched_setaffinity only)"
                log.warning("agent: model server %s: %s", r.spec.name, r.memory)
        log.info("agent: model server %s started, pid %d, pinned to %s (memory %s)", r.spec.name, r.proc.pid,
                 r.spec.pin.describe(), r.memory)
        if self._on_pid is not None:
            self._on_pid(r.spec.name, r.proc.pid)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            now = time.monotonic()
            for r in self._servers.values():
                if r.stopping or r.proc is None:
                    continue
                if r.due is not None:
                    if now >= r.due:
                        try:
                            await asyncio.to_thread(self._spawn, r)
                        except (OSError, subprocess.SubprocessError) as e:
                            log.error("agent: model server %s could not be started again: %s", r.spec.name, e)
                            r.due = now + r.backoff
                            r.backoff = min(MAX_BACKOFF_S, r.backoff * 2)
                    continue
                code = r.proc.poll()
                if code is None:
                    if now - r.started_at > STEADY_S:
                        r.backoff = BACKOFF_S
                    continue
                r.last_exit, r.restarts = code, r.restarts + 1
                r.due = now + r.backoff
                log.warning("agent: model server %s (pid %d) exited %d after %.1f s; starting it again in %.1f s",
                            r.spec.name, r.proc.pid, code, now - r.started_at, r.backoff)
                r.backoff = min(MAX_BACKOFF_S, r.backoff * 2)
                if self._on_exit is not None:
                    self._on_exit(r.spec.name, code)

    def pid(self, name: str) -> int | None:
        r = self._servers.get(name)
        return r.proc.pid if r is not None and r.proc is not None and r.proc.poll() is None else None

    def status(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for n, r in self._servers.items():
            out[n] = {"pid": self.pid(n), "restarts": r.restarts, "last_exit": r.last_exit, "numa_node": r.spec.pin.numa_node,
                      "cpus": list(r.spec.pin.cpus), "memory": r.memory}
        return out

    async def restart(self, name: str) -> str:
        """Stop server `name` and start it again, pinned as before; KeyError for one it does not supervise."""
        r = self._servers[name]
        old = r.proc.pid if r.proc is not None else None
        r.stopping = True
        try:
            await asyncio.to_thread(self._terminate, r)
            await asyncio.to_thread(self._spawn, r)
        finally:
            r.stopping = False
        assert r.proc is not None
        return f"model server {name}: pid {old} stopped, pid {r.proc.pid} started on {r.spec.pin.describe()}"

    def _terminate(self, r: _Running) -> None:
        p = r.proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for r in self._servers.values():
            r.stopping = True
        await asyncio.gather(*(asyncio.to_thread(self._terminate, r) for r in self._servers.values()))
        for r in self._servers.values():
            r.pinning.release()


__all__ = ["ServerSpec", "ServerSupervisor"]
