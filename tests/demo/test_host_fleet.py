"""The demo's choice of fleet and the namespace fleet's tear-down (the whole demo on the
namespace fleet is tests/demo/test_demo.py):

- where the namespace fleet cannot run, the demo says so in one line and falls back to the
  simulated cluster; `--fleet hosts` there is one error line naming why;
- an agent that cannot start (its model server's command is not runnable) is an error
  naming the host and the agent's own words, and `stop()` leaves no namespace, bridge,
  swtpm or etcd behind."""

from __future__ import annotations

import io
import json
import os
import subprocess
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
