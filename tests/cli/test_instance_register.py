"""`policyc instance register --endpoint` and `policyc topology hosts` against a real
`policyc serve` on the simulated cluster: the register command's own --help example runs as
printed (the facts it does not name come from the service's topology), and the hosts the
CLI lists are the ones the service checks registrations against."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "policyc.cli.main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    d = tmp_path_factory.mktemp("serve")
    env = {**os.environ, "POLICYC_SERVER": "", "POLICYC_TOKEN": "", "POLICYC_TOKEN_FILE": ""}
    env = {k: v for k, v in env.items() if not k.startswith("POLICYC_")}
    contracts = sorted(str(p) for p in (ROOT / "policies").glob("*.contract"))
    c = _run("compile", *contracts, "-o", str(d / "bundle.json"), env=env)
    assert c.returncode == 0, c.stderr
    port = _free_port()
    log = open(d / "serve.log", "w")
    proc = subprocess.Popen([*CLI, "serve", "--bundle", str(d / "bundle.json"), "--port", str(port),
                             "--state-dir", str(d / "state"), "--token", "client:test-client-token",
                             "--token", "auditor:test-auditor-token"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, (d / "serve.log").read_text()
            if (d / "state" / "operator-token").exists():
                r = _run("topology", "hosts", "--server", server, "--format", "json", env=env)
                if r.returncode == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("serve did not answer: " + (d / "serve.log").read_text())
        env = {**env, "POLICYC_SERVER": server}
        yield server, env
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _examples(command: list[str], env: dict[str, str]) -> list[str]:
    h = _run(*command, "--help", env=env)
    assert h.returncode == 0, h.stderr
    return [line.strip() for line in h.stdout.split("examples:", 1)[1].split("exit codes:", 1)[0].splitlines()
            if line.strip().startswith("policyc ")]


def test_topology_hosts_lists_the_services_hosts(served: tuple[str, dict[str, str]]) -> None:
    _, env = served
    r = _run("topology", "hosts", "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["known"] is True and len(doc["hosts"]) > 1
    names = [h["host"] for h in doc["hosts"]]
    assert names == sorted(names) and "host-0002" in names
    h2 = next(h for h in doc["hosts"] if h["host"] == "host-0002")
    assert h2["gpus"] and all(g["gpu"].startswith("gpu") and g["gpu_model"] for g in h2["gpus"])
    assert "127.0.0.1" in h2["addresses"]
    west = json.loads(_run("topology", "hosts", "--region", "us-west", "--format", "json", env=env).stdout)["hosts"]
    assert west and all(h["region"] == "us-west" for h in west) and len(west) < len(doc["hosts"])
    text = _run("topology", "hosts", "--gpus", env=env)
    assert text.returncode == 0 and re.search(r"^host-0002\s+gpu0\s", text.stdout, re.M), text.stdout


def test_register_help_example_works_against_serve(served: tuple[str, dict[str, str]]) -> None:
    """Each `instance register` example that names a host and endpoint runs as printed; the
    instance is then listed with the topology's facts and its endpoint."""
    _, env = served
    examples = [e for e in _examples(["instance", "register"], env) if "--endpoint 127.0.0.1" in e]
    assert examples
    for ex in examples:
        r = _run(*shlex.split(ex)[1:], env=env)
        assert r.returncode == 0, (ex, r.stdout, r.stderr)
        iid = shlex.split(ex)[3]
        listed = json.loads(_run("instance", "list", "--format", "json", env=env).stdout)["instances"]
        inst = next(i for i in listed if i["id"] == iid)
        hosts = json.loads(_run("topology", "hosts", "--format", "json", env=env).stdout)["hosts"]
        dep = inst["deployment"]
        host = next(h for h in hosts if h["host"] == dep["host"])
        gpu = next(g for g in host["gpus"] if g["gpu"] == dep["gpu"])
        assert dep["endpoint"] == "127.0.0.1:9001"
        assert dep["gpu_model"] == gpu["gpu_model"] and dep["region"] == host["region"]
        assert _run("instance", "deregister", iid, env=env).returncode == 0


def test_register_refuses_a_false_fact_with_its_truth(served: tuple[str, dict[str, str]]) -> None:
    _, env = served
    r = _run("instance", "register", "fs-x", "--model", "fraud-scorer", "--host", "host-0002", "--gpu", "gpu0",
             "--gpu-model", "H100", "--endpoint", "127.0.0.1:9002", env=env)
    assert r.returncode == 7, r.stdout + r.stderr
    assert "gpu_model" in r.stderr and "H100" in r.stderr, r.stderr
    r = _run("instance", "register", "fs-y", "--model", "fraud-scorer", "--host", "nope-1", "--gpu", "gpu0", env=env)
    assert r.returncode == 7 and "no such host" in r.stderr, r.stderr


def test_hosts_are_for_auditors_and_operators_not_clients(served: tuple[str, dict[str, str]]) -> None:
    _, env = served
    r = _run("topology", "hosts", "--token", "test-auditor-token", "--format", "json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["hosts"], r.stderr
    r = _run("topology", "hosts", "--token", "test-client-token", env=env)
    assert r.returncode == 7 and "PERMISSION_DENIED" in r.stderr, r.stderr
