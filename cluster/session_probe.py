"""The session store's latency, measured on the host: the agent writes a session's state
to the store's directory (write + fsync), drops the file's pages from the page cache
(`posix_fadvise(DONTNEED)`, so the read goes to the device where the filesystem allows it)
and reads it back, timing both, every `interval` seconds in a thread of its own (a slow
disk never stalls the signal ticker). The agent publishes the result with its time in its
report (`sessions`, per store `numaN/kind`), and the decision service puts it under the
store's endpoint name (`host/numaN/kind`), where the placer's dependency table takes its
`read_s` instead of the nominal figure (`placer/stores.measured_latency`).

`read_s` is the slowest read of the last `WINDOW` probes: the placer bounds a contract's
store by its p99, and a window's worst is that figure's honest estimate from few samples.

    probe = SessionProbe([SessionStore(0, "nvme", Path("/mnt/nvme0/policyc-sessions"))])
    probe.start(); probe.latest()   # {"numa0/nvme": {"read_s": …, "write_s": …, "time": …, …}}
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

log = logging.getLogger("policyc.agent")
KINDS = ("nvme", "host_memory")
WINDOW = 20
STATE_BYTES = 64 * 1024  # one session's state (a conversation's KV summary and history)


@dataclass(frozen=True)
class SessionStore:
    numa_node: int
    kind: str  # the contract's session state kind: nvme, host_memory
    directory: Path

    @property
    def key(self) -> str:
        return f"numa{self.numa_node}/{self.kind}"

    @classmethod
    def parse(cls, text: str) -> "SessionStore":
        """`NODE:KIND=DIR` (`--session-store 0:nvme=/mnt/nvme0/sessions`); ValueError naming the problem."""
        head, sep, directory = text.partition("=")
        node, _, kind = head.partition(":")
        if not sep or not directory or not node.isdigit() or kind not in KINDS:
            raise ValueError(f"--session-store `{text}`: NODE:KIND=DIR expected, KIND one of {', '.join(KINDS)} "
                             "(e.g. 0:nvme=/mnt/nvme0/policyc-sessions)")
        return cls(int(node), kind, Path(directory))


class SessionProbe:
    def __init__(self, stores: Sequence[SessionStore], *, interval: float = 1.0, state_bytes: int = STATE_BYTES) -> None:
        if not 0.05 <= interval <= 600:
            raise ValueError(f"session probe interval {interval!r} s: between 0.05 and 600 s")
        keys = [s.key for s in stores]
        if len(set(keys)) != len(keys):
            raise ValueError("session stores: one directory per NUMA node and kind")
        self.stores, self.interval, self.state_bytes = tuple(stores), interval, state_bytes
        self._reads: dict[str, deque[float]] = {s.key: deque(maxlen=WINDOW) for s in stores}
        self._latest: dict[str, dict[str, float]] = {}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._payload = os.urandom(state_bytes)

    def _file(self, s: SessionStore) -> Path:
        return s.directory / f".policyc-session-probe-{os.getpid()}.state"

    def start(self) -> None:
        """ValueError naming a directory that is not there or not writable (checked now, not at the first probe)."""
        for s in self.stores:
            if not s.directory.is_dir() or not os.access(s.directory, os.W_OK | os.X_OK):
                raise ValueError(f"--session-store {s.key}: {s.directory} is not a writable directory")
        self._thread = threading.Thread(target=self._run, name="policyc-agent-sessions", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for s in self.stores:
            try:
                self._file(s).unlink()
            except OSError:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            for s in self.stores:
                try:
                    self._probe(s)
                    self.errors.pop(s.key, None)
                except OSError as e:
                    if self.errors.get(s.key) != str(e):
                        log.warning("agent: session store %s (%s): %s", s.key, s.directory, e)
                    self.errors[s.key] = str(e)
            self._stop.wait(self.interval)

    def _probe(self, s: SessionStore) -> None:
        path = self._file(s)
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, self._payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        t1 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read goes to the store, not the page cache
            t2 = time.perf_counter()
            got = os.pread(fd, self.state_bytes, 0)
            t3 = time.perf_counter()
        finally:
            os.close(fd)
        if got != self._payload:
            raise OSError(f"the state read back is not the one written ({len(got)} of {self.state_bytes} bytes)")
        reads = self._reads[s.key]
        reads.append(t3 - t2)
        self._latest[s.key] = {"read_s": max(reads), "read_last_s": t3 - t2, "write_s": t1 - t0, "time": time.time(),
                               "samples": float(len(reads)), "interval_s": self.interval, "bytes": float(self.state_bytes)}

    def latest(self) -> dict[str, dict[str, float]]:
        """Per store, the latest figures (a store not yet probed, or failing, is absent)."""
        return {k: dict(v) for k, v in list(self._latest.items()) if k not in self.errors}


__all__ = ["SessionProbe", "SessionStore"]
