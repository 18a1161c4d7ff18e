"""The demo's choice of fleet and the namespace fleet's tear-down (the whole demo on the
namespace fleet is tests/demo/test_demo.py):

- where the namespace fleet cannot run, the demo says so in one line and falls back to the
  simulated cluster; `--fleet hosts` there is one error line naming why;
- an agent that cannot start (its model server's command is not runnable) is an error
  naming the host and the agent's own words, and `stop()` leaves no namespace, bridge,
  swtpm or etcd behind;
- SIGTERM (as Ctrl-C) while the hosts' agents start their servers: the same, and no agent
  or model server left."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from policyc.cluster import netns_agents
from policyc.cluster.netns_agents import AgentFleet, unavailable
from policyc.demo import run
from policyc.demo.narration import DemoError


class _Stop(Exception):
    pass


def _first_scene(fleet: str, why: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The demo's opening as far as the choice of fleet: the simulated path is stopped at its
    first step (the rest of it is the whole demo)."""
    monkeypatch.setattr(run, "unavailable", lambda: why)
    monkeypatch.setattr(run.Demo, "_compile", lambda self: (_ for _ in ()).throw(_Stop()))
    out = io.StringIO()
    with pytest.raises(_Stop):
        run.Demo(out, tmp_path, fleet)._scenes()
    return out.getvalue()


def test_without_namespaces_the_demo_says_it_falls_back_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    text = _first_scene("auto", "not root (network namespaces need root)", monkeypatch, tmp_path)
    assert text.splitlines() == [("fleet: falling back to the simulated cluster, no namespace fleet here: not root "
                                  "(network namespaces need root)")]
    assert _first_scene("simulated", "", monkeypatch, tmp_path).splitlines() == [
        "fleet: the simulated cluster, as asked (--fleet simulated)"]


def test_fleet_hosts_where_there_are_none_is_one_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(run, "unavailable", lambda: "swtpm not installed")
    with pytest.raises(DemoError, match=r"^--fleet hosts: no namespace fleet on this machine: swtpm not installed$"):
        run.Demo(io.StringIO(), tmp_path, "hosts")._scenes()


def test_unavailable_names_root_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns_agents.os, "geteuid", lambda: 1000)
    assert unavailable() == "not root (network namespaces need root)"


@pytest.mark.skipif(bool(unavailable()), reason="needs root, iproute2, etcd, swtpm and tpm2-tools (CI has them)")
def test_an_agent_that_cannot_start_is_named_and_everything_is_torn_down(tmp_path: Path) -> None:
    hosts = AgentFleet.start(["host-0002"], tmp_path / "hosts")
    made = {h.netns for h in hosts.fleet.hosts.values()}
    bridge, tpms, etcd = hosts.fleet.bridge, [h.tpm.proc for h in hosts.hosts.values()], hosts.etcd.members[0].proc
    try:
        assert set(hosts.enroll()) == {"host-0002"}
        spec = tmp_path / "servers.json"
        spec.write_text(json.dumps([{"name": "kserve-0", "numa_node": 0, "argv": ["/nonexistent/model-server"]}]))
        with pytest.raises(RuntimeError, match=r"the agent of host-0002 did not start: .*not an executable"):
            hosts.run_agents({"host-0002": spec})
    finally:
        hosts.stop()
    assert not made & set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not subprocess.run(["ip", "link", "show", bridge], capture_output=True).stdout
    assert all(p.poll() is not None for p in tpms) and etcd is not None and etcd.poll() is not None
    assert not any(os.path.exists(f"/proc/{h.pid}") for h in [*tpms, etcd])


def _processes_under(path: Path) -> list[int]:
    """Processes whose command line names something under `path` (agents, model servers, swtpm, etcd)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if str(path) in (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                continue
    return out


@pytest.mark.skipif(bool(unavailable()), reason="needs root, iproute2, etcd, swtpm and tpm2-tools (CI has them)")
@pytest.mark.timeout(300)
def test_sigterm_while_the_agents_start_tears_the_hosts_down(tmp_path: Path) -> None:
    """Stopped while its hosts' agents start their model servers, the demo removes the
    namespaces and the bridge and leaves no agent, model server, swtpm or etcd running."""
    env = {**os.environ, "POLICYC_VLLM_VENV": str(tmp_path / "no-vllm")}  # the LLM scene is not what this is about
    demo = subprocess.Popen([sys.executable, "-m", "policyc.cli.main", "demo", "--fleet", "hosts", "--workdir", str(tmp_path / "out")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert demo.stdout is not None
    seen = []
    try:
        for line in demo.stdout:  # ends at EOF if the demo exits early (asserted below)
            seen.append(line)
            if "`policyc agent run` (pid" in line:
                break
        text = "".join(seen)
        assert "`policyc agent run` (pid" in text, text + (demo.stderr.read() if demo.stderr else "")
        agents = [int(p) for p in re.findall(r"`policyc agent run` \(pid (\d+)\)", text)]
        demo.send_signal(signal.SIGTERM)
        rest, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert "Traceback" not in rest + err, (rest + err)[-3000:]
    assert demo.returncode == 130, (demo.returncode, err[-2000:])  # interrupted, as Ctrl-C
    bridge = re.search(r"on bridge (\S+) ", text)
    assert bridge is not None and not subprocess.run(["ip", "link", "show", bridge[1]], capture_output=True).stdout
    left = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not set(re.findall(r"in namespace (\S+),", text)) & left
    assert agents and not any(os.path.exists(f"/proc/{p}") for p in agents)
    assert _processes_under(tmp_path) == []
