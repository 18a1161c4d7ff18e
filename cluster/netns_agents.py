"""A fleet of hosts on one machine, each with its own agent: the network-namespace hosts of
`netns_fleet.py` (a bridge as the switch), one etcd member in the root namespace that every
host reaches over the bridge, a software TPM inside each host whose attestation key is made
there and enrolled by the operator, and one `policyc agent run` per host, which starts and
supervises that host's model servers and registers them on its own address. This is what
`policyc demo` runs on where root and network namespaces are available.

    hosts = AgentFleet.start(["host-0002", "host-0016"], workdir)   # namespaces, etcd, TPMs, keys
    hosts.enroll()                                    # as `policyc agent enroll` records each key
    hosts.run_agents({"host-0002": Path("servers.json")})            # agents up, each said ready
    hosts.fleet.hosts["host-0002"].address; hosts.etcd_url
    hosts.stop()                                      # agents (and their servers), TPMs, etcd, namespaces

`unavailable()` says in one line why this machine cannot run it (not root, a tool missing,
namespaces refused), or "" when it can. Every start step undoes what it made when it fails,
and `stop()` is safe to call at any point and more than once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .attestation import enroll
from .etcd_store import EtcdStore
from .keys import Keys
from .local_etcd import ETCD, LocalEtcd
from .local_tpm import SWTPM, SoftwareTpm
from .netns_fleet import NetnsError, NetnsFleet
from .tpm import HostTpm
from .tpm_quote import AttestationKey

PCRS = (0, 1, 2, 7)  # what every quote must cover (firmware and boot loader, secure boot)
READY_TIMEOUT_S = 90.0  # an agent imports policyc, makes its TPM session and its lease: slow on a loaded machine
TOOLS = ("ip", "tc", "etcdctl", "tpm2_createprimary", "tpm2_quote")


def unavailable() -> str:
    """Why this machine cannot run a namespace fleet, in one line ("" when it can): root,
    iproute2 and tc, etcd, swtpm and tpm2-tools, pyroute2 (the agent's discovery), and a
    namespace actually made and removed."""
    if os.geteuid() != 0:
        return "not root (network namespaces need root)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    missing += [p for p in (ETCD, SWTPM) if not Path(p).exists()]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/setup.sh installs them as root)"
    if importlib.util.find_spec("pyroute2") is None:
        return "pyroute2 not installed (the agent's interface discovery: pip install 'policyc[kernel]')"
    probe = f"pcprobe{os.getpid() % 100000}"
    out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        return f"`ip netns add` refused: {out.stderr.strip() or out.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return ""


class NamespaceTpm(HostTpm):
    """A host's TPM as its own namespace reaches it: tpm2-tools run inside that namespace
    (a software TPM listens on the host's own loopback)."""

    def __init__(self, netns: str, tcti: str, state_dir: Path) -> None:
        super().__init__(tcti, state_dir)
        self.netns = netns

    def _run(self, *argv: str) -> None:
        super()._run("ip", "netns", "exec", self.netns, *argv)


@dataclass
class AgentHost:
    name: str
    tpm: SoftwareTpm
    state_dir: Path  # the agent's key (wrapped by its TPM)
    ak_name: str = ""
    agent: "subprocess.Popen[str] | None" = None
    log: Path | None = None


@dataclass
class AgentFleet:
    fleet: NetnsFleet
    etcd: LocalEtcd
    workdir: Path
    prefix: str
    hosts: dict[str, AgentHost] = field(default_factory=dict)

    @property
    def etcd_url(self) -> str:
        """etcd as the hosts reach it: the root namespace's address on the bridge."""
        return f"http://{self.fleet.gateway}:{self.etcd.members[0].client_port}"

    @classmethod
    def start(cls, names: Sequence[str], workdir: Path, *, prefix: str | None = None) -> "AgentFleet":
        """The namespaces, etcd, a software TPM in each host and its attestation key made there;
        NetnsError or RuntimeError (with what was made undone) when a step fails."""
        workdir.mkdir(parents=True, exist_ok=True)
        fleet = NetnsFleet.create(names)
        out: AgentFleet | None = None
        try:
            etcd = LocalEtcd.start(1, also_listen=fleet.gateway)
            out = cls(fleet, etcd, workdir, prefix or f"/policyc-hosts-{os.getpid()}/")
            for name in names:
                netns = fleet.hosts[name].netns
                tpm = SoftwareTpm.start(netns=netns)
                host = out.hosts[name] = AgentHost(name, tpm, workdir / "agents" / name)
                pub = NamespaceTpm(netns, tpm.tcti, host.state_dir).attestation_key()
                host.ak_name = AttestationKey.parse(pub).name.hex()
            return out
        except BaseException:
            if out is not None:
                out.stop()
            else:
                fleet.destroy()
            raise

    def enroll(self) -> dict[str, str]:
        """Each host's attestation key recorded in the fleet, as `policyc agent enroll` does
        (the operator's step): host → key name."""
        async def go() -> None:
            store = EtcdStore(self.etcd.endpoints, op_timeout=5.0)
            await store.connect()
            try:
                for h in self.hosts.values():
                    pub = (h.state_dir / "ak.pub").read_bytes()
                    await enroll(store, Keys(self.prefix), h.name, pub, pcrs=PCRS, by="policyc demo (the operator)")
            finally:
                await store.close()
        asyncio.run(go())
        return {h.name: h.ak_name for h in self.hosts.values()}

    def run_agents(self, servers: dict[str, Path], *, flags: dict[str, list[str]] | None = None,
                   signal_period: float = 0.2) -> None:
        """`policyc agent run` inside each host (with its TPM, `servers[host]` as its
        `--servers` file and `flags[host]` added, where given, e.g. the operator's site facts
        `--region`); returns once every agent said it is ready.
        RuntimeError with the agent's log when one exits or stays silent."""
        for h in self.hosts.values():
            h.log = self.workdir / "agents" / f"{h.name}.log"
            argv = [sys.executable, "-m", "policyc.cli.main", "agent", "run", "--host", h.name, "--etcd", self.etcd_url,
                    "--etcd-prefix", self.prefix, "--tcti", h.tpm.tcti, "--state-dir", str(h.state_dir),
                    "--signal-period", str(signal_period)]
            argv += (flags or {}).get(h.name, [])
            if h.name in servers:
                argv += ["--servers", str(servers[h.name]), "--server-logs", str(self.workdir / "agents" / f"{h.name}-servers")]
            with open(h.log, "ab") as log:
                h.agent = self.fleet.popen(h.name, argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                           text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + READY_TIMEOUT_S
        for h in self.hosts.values():
            line = self._ready_line(h, deadline)
            if f"host {h.name} ready" not in line:
                raise RuntimeError(f"the agent of {h.name} did not start: {line.strip() or 'no output'}; {self.log_tail(h)}")

    @staticmethod
    def _ready_line(h: AgentHost, deadline: float) -> str:
        assert h.agent is not None and h.agent.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([h.agent.stdout], [], [], 0.2)
            if ready:
                return h.agent.stdout.readline()
            if h.agent.poll() is not None:
                return f"exited {h.agent.returncode}"
        return f"nothing within {READY_TIMEOUT_S:g} s"

    def log_tail(self, h: AgentHost, lines: int = 8) -> str:
        try:
            text = h.log.read_text(errors="replace") if h.log is not None else ""
        except OSError:
            text = ""
        return " | ".join(text.splitlines()[-lines:]) or "(its log is empty)"

    def stop_agents(self) -> None:
        """Every agent stopped (each stops its model servers first); the rest stays up."""
        running = [h.agent for h in self.hosts.values() if h.agent is not None]
        for p in running:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in running:
            try:
                p.wait(25)  # the agent gives each server 10 s to stop
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            if p.stdout is not None:
                p.stdout.close()
        for h in self.hosts.values():
            h.agent = None

    def stop(self) -> None:
        """Agents first (each stops its model servers), then the TPMs, etcd and the namespaces."""
        self.stop_agents()
        for h in self.hosts.values():
            h.tpm.stop()
        self.hosts.clear()
        self.etcd.stop()
        self.fleet.destroy()


__all__ = ["AgentFleet", "AgentHost", "NamespaceTpm", "NetnsError", "PCRS", "unavailable"]
