"""A model server forked by its pool's zygote (`zygote.py`), seen through the calls of
`subprocess.Popen` the launcher uses, read from the files the zygote writes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class Forked:
    """A model server the pool's zygote forked: the same calls as `subprocess.Popen`'s
    that the launcher uses, read from the files the zygote writes (`pid`, `exit`)."""

    def __init__(self, workdir: Path, zygote: subprocess.Popen[bytes]) -> None:
        self.workdir = workdir
        self.zygote = zygote
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        try:
            return int((self.workdir / "pid").read_text())
        except (OSError, ValueError):
            return None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = int((self.workdir / "exit").read_text())
            except (OSError, ValueError):
                if self.zygote.poll() is not None:  # the zygote is gone: nothing will reap or report it
                    self.returncode = self.zygote.returncode if self.pid is None else -signal.SIGKILL
        return self.returncode

    def send_signal(self, sig: int) -> None:
        pid = self.pid
        if pid is not None and self.poll() is None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("model server", timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode
