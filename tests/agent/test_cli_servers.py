"""`policyc agent run --servers FILE` as an operator runs it: the agent starts the listed
model servers pinned where the file says (read back from the kernel), ends them when it
stops, and refuses a file it cannot honour with exit 2, naming the entry; a real etcd."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_rig import eventually, new_prefix

from policyc.cluster.server_pinning import read_affinity
from policyc.cluster.server_specs import load_specs

POLICYC = [sys.executable, "-m", "policyc.cli.main"]


def _children(pid: int) -> list[int]:
    """Every thread's children (the agent starts its servers from a worker thread)."""
    out: list[int] = []
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (t / "children").read_text().split()]
        except OSError:
            pass
    return out


def test_the_agent_starts_its_servers_pinned_and_ends_them_with_it(etcd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "servers.json"
    spec.write_text(json.dumps([{"name": "idle-0", "argv": ["sleep", "300"], "numa_node": 0, "cpus": "0"}]))
    p = subprocess.Popen([*POLICYC, "agent", "run", "--host", "host-0003", "--signal-period", "0", "--servers", str(spec),
                          "--etcd", *etcd.endpoints, "--etcd-prefix", new_prefix()],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "host host-0003 ready" in line, line + (p.stderr.read() if p.poll() is not None and p.stderr else "")
        eventually(lambda: bool(_children(p.pid)), 20, step=0.05)
        (child,) = _children(p.pid)
        assert Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
        assert read_affinity(child)[0] == (0,)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    assert p.returncode == 0
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]


def test_a_servers_file_it_cannot_honour_is_exit_2(etcd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "servers.json"
    spec.write_text(json.dumps([{"name": "a", "argv": ["sleep", "1"], "numa_node": 0, "cpus": "4095"}]))
    out = subprocess.run([*POLICYC, "agent", "run", "--host", "host-0003", "--signal-period", "0", "--servers", str(spec),
                          "--etcd", *etcd.endpoints, "--etcd-prefix", new_prefix()], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "CPUs 4095" in out.stderr and "Traceback" not in out.stderr, out.stderr
    for body, words in (([{"name": "a", "argv": [], "numa_node": 0}], "server 1: `argv`"),
                        ([{"name": "a", "argv": ["sleep"], "numa_node": 0, "colour": "red"}], "unknown field(s) colour"),
                        ([{"name": "a", "argv": ["sleep"], "gpu": "gpu0", "numa_node": 1}], "not both"),
                        ({"name": "a"}, "a list of at most"),
                        ([{"name": "a b", "argv": ["sleep"], "numa_node": 0}], "model server name")):
        spec.write_text(json.dumps(body))
        with pytest.raises(ValueError, match=re.escape(words)):
            load_specs(spec)
