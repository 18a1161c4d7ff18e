"""`policyc agent key|enroll|run|attest` as an operator runs them: real processes, a real
software TPM, a real etcd member."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent_rig import new_prefix

POLICYC = [sys.executable, "-m", "policyc.cli.main"]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*POLICYC, "agent", *args], capture_output=True, text=True, timeout=timeout)


def test_key_enroll_run_attest_through_the_cli(etcd, tpms, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tcti = tpms["b"].tcti
    store = ["--etcd", *etcd.endpoints, "--etcd-prefix", new_prefix()]
    ak = tmp_path / "host-0003.ak"
    made = _cli("key", "--tcti", tcti, "--state-dir", str(tmp_path / "agent"), "--out", str(ak))
    assert made.returncode == 0, made.stderr
    name = made.stdout.split()[2]
    assert made.stdout.startswith("attestation key 000b") and ak.stat().st_size > 80
    again = _cli("key", "--tcti", tcti, "--state-dir", str(tmp_path / "agent"))
    assert again.stdout.split()[2] == name  # kept, not made again

    enrolled = _cli("enroll", "--host", "host-0003", "--ak", str(ak), "--pcrs", "sha256:0,1,7", *store)
    assert enrolled.returncode == 0 and name in enrolled.stdout, enrolled.stderr
    for bad, code, words in ((["--ak", str(tmp_path / "missing")], 2, "No such file"),
                             (["--ak", str(tmp_path / "agent" / "ak.priv")], 1, "attestation key"),
                             (["--ak", str(ak), "--pcrs", "sha1:0"], 2, "SHA-256 bank")):
        out = _cli("enroll", "--host", "host-0003", *bad, *store)
        assert out.returncode == code and words in out.stderr and "Traceback" not in out.stderr, out.stderr

    refused = _cli("attest", "--host", "host-0003", "--timeout", "2", *store)  # no agent runs yet
    assert refused.returncode == 1 and "did not answer the challenge" in refused.stderr, refused.stderr

    agent = subprocess.Popen([*POLICYC, "agent", "run", "--host", "host-0003", "--tcti", tcti, "--state-dir",
                              str(tmp_path / "agent"), *store], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert "host host-0003 ready" in line and name[:20] in line, line + (agent.stderr.read() if agent.poll() is not None else "")
        t0 = time.monotonic()
        ok = _cli("attest", "--host", "host-0003", *store)
        assert ok.returncode == 0 and "attested with key" in ok.stdout, ok.stderr
        assert {p.split("=")[0] for p in ok.stdout.split("PCRs ")[1].split(", ")} == {"0", "1", "7"}
        assert time.monotonic() - t0 < 30
        unknown = _cli("attest", "--host", "host-0004", *store)
        assert unknown.returncode == 1 and "not enrolled" in unknown.stderr
    finally:
        os.kill(agent.pid, signal.SIGTERM)
        assert agent.wait(20) == 0
