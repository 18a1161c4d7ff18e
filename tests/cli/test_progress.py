"""Progress on long compiles and verifies: drawn on stderr when it is a terminal (a real
pseudo-terminal here), nothing at all when it is a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from policy_text import REPO


def _run_with_stderr_on_a_tty(*argv: str) -> tuple[int, bytes]:
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "policyc.cli.main", *argv], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=follower, env={**os.environ, "COLUMNS": "100", "TERM": "xterm"})
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=120), out


def test_compile_shows_progress_on_a_terminal_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, tty = _run_with_stderr_on_a_tty("compile", "policies", "-o", str(tmp_path / "b.json"))
    assert code == 0
    assert b"compiling 8 files" in tty, tty[-500:]
    piped = subprocess.run([sys.executable, "-m", "policyc.cli.main", "compile", "policies", "-o", str(tmp_path / "c.json")],
                           cwd=REPO, capture_output=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == b""
