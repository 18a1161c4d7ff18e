"""`policyc agent facts` as an operator runs it: the host's interfaces, hardware and the
site facts given in its flags or the `[agent]` table of its configuration file, each fact
with its source; a bad site value is exit 2 naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from policyc.cluster.host_facts import HostFacts
from policyc.cluster.host_hardware import Site, discover_hardware

POLICYC = [sys.executable, "-m", "policyc.cli.main"]


def test_agent_facts_prints_each_fact_with_its_source(tmp_path: Path) -> None:
    out = subprocess.run([*POLICYC, "agent", "facts", "--host", "host-0003", "--region", "eu-west", "--zone", "eu-west-1a",
                          "--hardware-firewall", "true"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    facts = HostFacts.from_json(json.loads(out.stdout))
    assert facts.host == "host-0003" and facts.hardware is not None and facts.interfaces
    assert facts.hardware == discover_hardware(Site("eu-west", "eu-west-1a", True))  # what this machine is, as read here
    assert {"site.region", "site.zone", "site.hardware_firewall"} <= set(facts.hardware.sources)
    # the agent's configuration file is where an operator keeps them: a value that is no site fact is refused there
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[agent]\nhost = "host-0003"\nhardware-firewall = "maybe"\netcd = ["http://127.0.0.1:1"]\n')
    bad = subprocess.run([*POLICYC, "agent", "run", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "hardware-firewall" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
