"""Self-heal started by the host agent's own link-down report, on the namespace fleet (needs
root, iproute2 and etcd): three hosts as network namespaces, a real `policyc agent run` in
each, etcd and a leader replica with `--self-heal execute` in the root namespace
(`cluster/link_heal.py`).

    .venv/bin/python benchmarks/agent_link_down.py [--rounds 3]

Each round gives one host a data link (`data0`, a veth on the bridge) and takes it down in
that host's namespace; from the `ip` command's return it reports the time until the
replica holds that host's report of the link down, until the leader audits its plan (rule
`agent-link-down`, with the fencing token), until that host's agent's answer `done` is
audited, and until `data0` is UP again in that namespace (read with `ip`). No anomaly and
no operator is involved: the agent's measured operstate is the trigger.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO.parent))
sys.path.insert(0, str(Path(__file__).parent))

from agent import HOSTS, _agents, _stop  # noqa: E402

from policyc.cluster.config import FleetConfig  # noqa: E402
from policyc.cluster.link_heal import RULE  # noqa: E402
from policyc.cluster.local_etcd import LocalEtcd  # noqa: E402
from policyc.cluster.netns_fleet import NetnsFleet  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.enforcer.records import Outcome  # noqa: E402
from policyc.server.app import DecisionServer, ServerThread  # noqa: E402
from policyc.server.config import ClusterSpec, EnforcerMode, SelfHeal, ServeConfig  # noqa: E402


def _up(ns: str) -> bool:
    out = subprocess.run(["ip", "-n", ns, "link", "show", "data0"], capture_output=True, text=True, timeout=20).stdout
    return "UP" in out.split(">")[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("benchmarks/agent_link_down.py needs root (network namespaces)")
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    fleet = NetnsFleet.create(HOSTS)
    etcd = LocalEtcd.start(1, also_listen=fleet.gateway)
    url = f"http://{fleet.gateway}:{etcd.members[0].client_port}"
    peers = [fleet.add_link(h) for h in HOSTS]  # a second cable per host, `data0`
    totals: list[float] = []
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    try:
        for n in range(args.rounds):
            prefix = f"/policyc-agent-link-down-{os.getpid()}-{n}/"
            cfg = FleetConfig(etcd=tuple(etcd.endpoints), name="leader", prefix=prefix, lease_ttl=2, report_interval=0.3)
            th = ServerThread(DecisionServer(r.bundle, ServeConfig(
                cluster=ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4), enforcer=EnforcerMode.USERSPACE,
                watch_gpus=False, fleet=cfg, open_fleet=True, self_heal=SelfHeal.EXECUTE)))
            th.start()
            agents = _agents(fleet, url, prefix, 0.2, [])
            try:
                rep = th.server.replica
                book = rep.host_signals
                deadline = time.monotonic() + 30
                while (set(book.reports) != set(HOSTS) or set(rep.host_facts) != set(HOSTS) or not rep.election.token
                       or any(book.reports[h].interfaces.get("data0", {}).get("up") != 1.0 for h in HOSTS)) \
                        and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert th.server.actions is not None
                records = th.server.actions.memory.records
                b = HOSTS[n % len(HOSTS)]
                ns = fleet.hosts[b].netns
                fleet.set_link(b, "data0", up=False)
                t0 = time.monotonic()
                seen = planned = done = up = None
                token = 0
                while time.monotonic() - t0 < 60 and up is None:
                    now = time.monotonic() - t0
                    if seen is None and book.reports[b].interfaces.get("data0", {}).get("up") == 0.0:
                        seen = now
                    recs = list(records)
                    if planned is None and any(x.rule == RULE and x.source.startswith("replica") for x in recs):
                        planned, token = now, rep.election.token
                    if done is None and any(x.source == f"agent {b}" and x.outcome is Outcome.DONE for x in recs):
                        done = now
                    if done is not None and _up(ns):
                        up = time.monotonic() - t0
                    time.sleep(0.01)
                steps = [f"{x.target}: {x.outcome.value} ({x.source})" for x in list(records) if x.rule == RULE]

                def ms(v: float | None) -> str:
                    return "-" if v is None else f"{v * 1e3:.0f} ms"
                print(f"round {n + 1}: host {b}: report of data0 down in the replica after {ms(seen)}, plan audited after "
                      f"{ms(planned)} (fencing token {token}), {b}'s agent's answer done after {ms(done)}, data0 UP in its "
                      f"namespace after {ms(up)}", flush=True)
                print("  audit: " + "; ".join(steps), flush=True)
                if up is not None:
                    totals.append(up)
            finally:
                _stop(list(agents.values()))
                th.stop()
        if totals:
            print(f"link down -> healed by its host's agent, started by that agent's own report: median "
                  f"{statistics.median(totals) * 1e3:.0f} ms (range {min(totals) * 1e3:.0f}-{max(totals) * 1e3:.0f} ms over "
                  f"{len(totals)} rounds); load {os.getloadavg()[0]:.2f} at the end", flush=True)
    finally:
        for peer in peers:
            subprocess.run(["ip", "link", "del", peer], capture_output=True, timeout=20)
        etcd.stop()
        fleet.destroy()


if __name__ == "__main__":
    main()
