"""The host agent on the namespace fleet (needs root, iproute2, tc and etcd): three hosts as
network namespaces, a real `policyc agent run` in each, etcd and one replica in the root
namespace.

    .venv/bin/python benchmarks/agent.py [--quick] [--period 0.2] [--rounds 3]

Reports:
- the agents' own collection period and jitter (standard deviation of the intervals between
  tick starts, the worst lateness) at `--period`, as each agent reports it over its last 50
  ticks, while the machine is loaded (one busy process per CPU at normal priority), first
  without isolation flags, then with `--sched-fifo 50 --cpus 0`;
- agent CPU per tick per host: the collector thread's (`thread_time`, as reported) and the
  whole agent process's (utime + stime from /proc over the window, divided by its ticks:
  etcd writes, lease and the interpreter included);
- time from a shaped port to the placement moving: the host the placement chose gets its
  data class shaped (HTB 1 Mbit/s with a 100 kB fifo, the agent's etcd traffic classed
  apart) and flooded; the time from the `tc` command's return to the first decision placed
  elsewhere, per round, and how full the queue was in the replica's latest report then (a
  partly filled queue already adds buffer delay to the prediction through the watermark
  column; over 80 % refuses the host outright) (a decision every 100 ms; faster, the share each decision reserves
  until the next tick moves placements by itself), beside a control at the same pace unshaped;
- time from the 10th anomaly to a healed link and a rebalanced placement (`--heal`, or
  `--heal-only`): a leader replica with `--self-heal execute`; the host the placement chose
  gets a data link (`data0`, a veth on the bridge) that fails (taken down in its
  namespace; its agent reports it down); ten SM-utilisation anomalies on that host's GPU go
  to the guardian at the refresher's pace (200 ms; the rule `sm-collapse` fires at the
  10th: report, self-heal [gpu_reset, rdma_link_refresh, rebalance]); from the 10th, the
  time until the agent of that host has answered the link refresh done (the link is up in
  its namespace, audited with host and fencing token) and until a decision is placed on
  another host (the rebalance cordoned the node and re-registered its instance elsewhere).
  The seed's figure: 8.7 s, against 3.2 min by hand.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO.parent))

from policyc.cluster.config import FleetConfig  # noqa: E402
from policyc.cluster.host_signals import backlog_fraction  # noqa: E402
from policyc.cluster.local_etcd import LocalEtcd  # noqa: E402
from policyc.cluster.netns_fleet import NetnsError, NetnsFleet  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.server.app import DecisionServer, ServerThread  # noqa: E402
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig  # noqa: E402
from policyc.server.fleet import admissible_fleet  # noqa: E402
from policyc.server.proto import pb, pb_grpc  # noqa: E402

HOSTS = ("host-0002", "host-0005", "host-0006")
POLICYC = [sys.executable, "-m", "policyc.cli.main"]
BUSY = "while True:\n    pass\n"
SENDER = ("import socket,sys,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\nwhile True:\n"
          "    try: s.sendto(b'x'*1400,(sys.argv[1],9))\n    except OSError: pass\n    time.sleep(0.002)\n")
TICK = os.sysconf("SC_CLK_TCK")
PACE = 0.1  # s between decisions: each reserves its share until the next tick; faster moves placements by share alone


def _cpu_s(pid: int) -> float:
    """utime + stime of a process and its threads, seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    f = stat[stat.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / TICK


def _agents(fleet: NetnsFleet, url: str, prefix: str, period: float, extra: list[str]) -> dict[str, "subprocess.Popen[str]"]:
    out = {}
    for h in HOSTS:
        out[h] = fleet.popen(h, [*POLICYC, "agent", "run", "--host", h, "--etcd", url, "--etcd-prefix", prefix,
                                 "--signal-period", str(period), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for h, p in out.items():
        assert p.stdout is not None
        line = p.stdout.readline()
        if f"host {h} ready" not in line:
            raise SystemExit(f"agent {h} did not start: {line}{p.stderr.read() if p.stderr else ''}")
    return out


def _stop(procs: list["subprocess.Popen[str]"]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def _agent_pid(fleet_proc: "subprocess.Popen[str]") -> int:
    """`ip netns exec` execs the agent: the Popen's pid is the agent's."""
    return fleet_proc.pid


def _period_run(fleet: NetnsFleet, url: str, prefix: str, period: float, seconds: float, extra: list[str],
                book, label: str) -> None:  # type: ignore[no-untyped-def]
    agents = _agents(fleet, url, prefix, period, extra)
    try:
        time.sleep(2.0)  # settle: lease, first reports
        c0 = {h: _cpu_s(_agent_pid(p)) for h, p in agents.items()}
        t0 = {h: book.reports[h].agent.get("ticks", 0.0) for h in HOSTS if h in book.reports}
        time.sleep(seconds)
        for h in HOSTS:
            r = book.reports.get(h)
            if r is None:
                print(f"{label} {h}: no report")
                continue
            a = r.agent
            ticks = a.get("ticks", 0.0) - t0.get(h, 0.0)
            proc = (_cpu_s(_agent_pid(agents[h])) - c0[h]) / ticks if ticks else float("nan")
            print(f"{label} {h}: period {a.get('period_mean_s', float('nan')) * 1e3:.1f} ms ± {a.get('jitter_s', float('nan')) * 1e3:.2f} ms "
                  f"(worst late {a.get('late_max_s', float('nan')) * 1e3:.1f} ms) over its last "
                  f"{min(50, int(a.get('ticks', 0)))} ticks; collector CPU/tick {a.get('cpu_per_tick_s', float('nan')) * 1e3:.2f} ms, agent process CPU/tick "
                  f"{proc * 1e3:.2f} ms over {ticks:.0f} ticks", flush=True)
    finally:
        _stop(list(agents.values()))
        time.sleep(0.5)


def _shape(fleet: NetnsFleet, host: str, control_port: int) -> None:
    """HTB 1 Mbit/s with a 100 kB fifo on the host's eth0, the agent's etcd traffic classed apart."""
    try:
        fleet.shape_uplink(host, rate="1mbit", queue_bytes=100_000, spare_dports=[control_port])
    except NetnsError as e:
        raise SystemExit(str(e)) from None


def _unshape(fleet: NetnsFleet, host: str) -> None:
    fleet.unshape_uplink(host)


def _register_per_host(stub, rec, fleet) -> None:  # type: ignore[no-untyped-def]
    """One recommender instance per namespace host, its endpoint on that host's own address."""
    for h in HOSTS:
        inst = rec[h]
        dep = {k: v for k, v in inst.deployment.model_dump().items() if k in pb.Deployment.DESCRIPTOR.fields_by_name}
        dep["endpoint"] = f"{fleet.hosts[h].address}:8000"
        stub.RegisterInstance(pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep)),
                              timeout=60)


def _heal_rounds(bundle, fleet: NetnsFleet, etcd: LocalEtcd, rounds: int) -> None:  # type: ignore[no-untyped-def]
    """From the 10th anomaly to a healed link and a rebalanced placement (see the module's docstring)."""
    from policyc.enforcer.executor import HealTarget
    from policyc.enforcer.records import Outcome
    from policyc.server.config import SelfHeal

    url = f"http://{fleet.gateway}:{etcd.members[0].client_port}"
    peers = []
    for h in HOSTS:  # a second cable per host, `data0` (its etcd traffic stays on eth0)
        try:
            peers.append(fleet.add_link(h))
        except NetnsError as e:
            raise SystemExit(str(e)) from None
    heals: list[tuple[float, float]] = []
    try:
        for n in range(rounds):
            prefix = f"/policyc-agent-heal-{os.getpid()}-{n}/"
            cfg = FleetConfig(etcd=tuple(etcd.endpoints), name="leader", prefix=prefix, lease_ttl=2, report_interval=0.3)
            th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4),
                                                                 enforcer=EnforcerMode.USERSPACE, watch_gpus=False, fleet=cfg,
                                                                 open_fleet=True, self_heal=SelfHeal.EXECUTE)))
            th.start()
            # this times the anomaly rule's heal: the heal the agent's own link-down report starts (on by default)
            # would mend the link first; benchmarks/agent_link_down.py times that one
            th.server.replica.link_heal.enabled = False
            agents = _agents(fleet, url, prefix, 0.2, [])
            try:
                rep = th.server.replica
                book = rep.host_signals
                deadline = time.monotonic() + 30
                while (set(book.reports) != set(HOSTS) or not rep.election.token) and time.monotonic() < deadline:
                    time.sleep(0.05)
                slots = th.server.cluster.gpu_slots()  # type: ignore[union-attr]
                rec = {i.deployment.host: i for i in admissible_fleet(bundle, slots, models=["recommender"])}
                with grpc.insecure_channel(f"127.0.0.1:{th.server.port}") as ch:
                    stub = pb_grpc.DecisionsStub(ch)
                    _register_per_host(stub, rec, fleet)
                    req = pb.DecideRequest(headers={"X-Model": "recommender"})
                    b = stub.Decide(req, timeout=30).placement.host
                    gpu = rec[b].deployment.gpu
                    ns = fleet.hosts[b].netns
                    subprocess.run(["ip", "-n", ns, "link", "set", "data0", "down"], check=True, timeout=20)
                    deadline = time.monotonic() + 20
                    while book.reports[b].interfaces.get("data0", {}).get("up") != 0.0 and time.monotonic() < deadline:
                        time.sleep(0.05)
                    guardian = th.server.guardian
                    assert guardian is not None and th.server.actions is not None
                    records = th.server.actions.memory.records
                    target = HealTarget(f"{b}/{gpu}", b, gpu.removeprefix("gpu"), "data0")
                    for _ in range(9):  # at the refresher's pace, as its SM-utilisation feed would
                        guardian.set_heal_target(target)
                        guardian.observe_gpu(target.gpu_key, {"sm_utilization": 0.05})
                        time.sleep(0.2)
                    guardian.set_heal_target(target)
                    t0 = time.monotonic()
                    verdict = guardian.observe_gpu(target.gpu_key, {"sm_utilization": 0.05})  # the 10th
                    fired_s = time.monotonic() - t0
                    healed = moved = None
                    while time.monotonic() - t0 < 60 and (healed is None or moved is None):
                        if healed is None and any(r.source == f"agent {b}" and r.outcome is Outcome.DONE
                                                  and r.target.startswith("link_refresh") for r in list(records)):
                            healed = time.monotonic() - t0
                        if moved is None:
                            d = stub.Decide(req, timeout=30)
                            if d.placement.host and d.placement.host != b:
                                moved = time.monotonic() - t0
                        time.sleep(0.02)
                    up = "UP" in subprocess.run(["ip", "-n", ns, "link", "show", "data0"], capture_output=True, text=True,
                                                timeout=20).stdout.split(">")[0]
                    steps = [f"{r.target}: {r.outcome.value} ({r.source})" for r in list(records)
                             if r.kind.value == "self_heal_step" and r.target != "self_heal_mode"]
                    print(f"heal round {n + 1}: host {b}, rule fired {verdict.fired} (the 10th observe took {fired_s * 1e3:.0f} ms); "
                          f"link healed by {b}'s agent after {'-' if healed is None else f'{healed:.2f} s'} (data0 "
                          f"{'UP' if up else 'DOWN'} in its namespace); placement off {b} after "
                          f"{'-' if moved is None else f'{moved:.2f} s'}", flush=True)
                    print("  steps: " + "; ".join(steps), flush=True)
                    if healed is not None and moved is not None:
                        heals.append((healed, moved))
            finally:
                _stop(list(agents.values()))
                th.stop()
        if heals:
            both = [max(h, m) for h, m in heals]
            print(f"10th anomaly -> healed link and rebalanced placement: median {statistics.median(both):.2f} s "
                  f"(range {min(both):.2f}-{max(both):.2f} s over {len(both)} rounds; link "
                  f"{statistics.median([h for h, _ in heals]):.2f} s, placement {statistics.median([m for _, m in heals]):.2f} s "
                  "median); seed: 8.7 s, by hand 3.2 min", flush=True)
    finally:
        for peer in peers:
            subprocess.run(["ip", "link", "del", peer], capture_output=True, timeout=20)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="6 s windows, 2 shaping rounds")
    ap.add_argument("--heal", action="store_true", help="also time the 10th anomaly to a healed link and rebalanced placement")
    ap.add_argument("--heal-only", action="store_true", help="only that")
    ap.add_argument("--period", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    seconds, rounds = (6.0, 2) if args.quick else (10.0, args.rounds)
    if os.geteuid() != 0:
        raise SystemExit("benchmarks/agent.py needs root (network namespaces, tc)")
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    bundle = r.bundle
    fleet = NetnsFleet.create(HOSTS)
    etcd = LocalEtcd.start(1, also_listen=fleet.gateway)
    if args.heal_only:
        try:
            _heal_rounds(bundle, fleet, etcd, rounds)
        finally:
            etcd.stop()
            fleet.destroy()
        return
    prefix = f"/policyc-agent-bench-{os.getpid()}/"
    cfg = FleetConfig(etcd=tuple(etcd.endpoints), name="r0", prefix=prefix, lease_ttl=2, report_interval=0.3)
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4),
                                                         enforcer=EnforcerMode.USERSPACE, watch_gpus=False, fleet=cfg,
                                                         open_fleet=True)))
    th.start()
    url = f"http://{fleet.gateway}:{etcd.members[0].client_port}"
    book = th.server.replica.host_signals
    load: list["subprocess.Popen[str]"] = []
    try:
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
        load = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(os.cpu_count() or 1)]
        print(f"loaded: {len(load)} busy processes", flush=True)
        _period_run(fleet, url, prefix, args.period, seconds, [], book, "plain")
        _period_run(fleet, url, prefix, args.period, seconds, ["--sched-fifo", "50", "--cpus", "0"], book, "isolated")
        _stop(load)
        load = []
        print(f"unloaded, load {os.getloadavg()[0]:.2f}", flush=True)

        agents = _agents(fleet, url, prefix, args.period, [])
        try:
            deadline = time.monotonic() + 20
            while set(book.reports) != set(HOSTS) and time.monotonic() < deadline:
                time.sleep(0.1)
            slots = th.server.cluster.gpu_slots()  # type: ignore[union-attr]
            rec = {i.deployment.host: i for i in admissible_fleet(bundle, slots, models=["recommender"])}
            with grpc.insecure_channel(f"127.0.0.1:{th.server.port}") as ch:
                stub = pb_grpc.DecisionsStub(ch)
                _register_per_host(stub, rec, fleet)
                req = pb.DecideRequest(headers={"X-Model": "recommender"})
                moves = []

                def fill(host: str) -> float:
                    rep = book.reports.get(host)
                    return (backlog_fraction(rep.interfaces.get("eth0", {})) or 0.0) if rep is not None else 0.0
                for n in range(rounds):
                    time.sleep(2.0)
                    chosen = stub.Decide(req, timeout=30).placement.host
                    stayed = 0
                    for _ in range(20):  # control: unshaped, at the same pace, does the placement stay?
                        time.sleep(PACE)
                        stayed += stub.Decide(req, timeout=30).placement.host == chosen
                    print(f"control round {n + 1}: unshaped, {stayed} of 20 decisions stayed on {chosen}", flush=True)
                    sender = fleet.popen(chosen, [sys.executable, "-c", SENDER, fleet.gateway])
                    _shape(fleet, chosen, etcd.members[0].client_port)
                    t0 = time.monotonic()
                    seen = None
                    moved = None
                    at_move = 0.0
                    while time.monotonic() - t0 < 30:
                        if seen is None and fill(chosen) > 0.05:
                            seen = time.monotonic() - t0
                        d = stub.Decide(req, timeout=30)
                        if d.placement.host and d.placement.host != chosen:
                            moved = time.monotonic() - t0
                            at_move = fill(chosen)
                            seen = moved if seen is None and at_move > 0.05 else seen  # landed between the look and the decision
                            break
                        time.sleep(PACE)
                    _stop([sender])
                    _unshape(fleet, chosen)
                    if moved is None:
                        print(f"shaped round {n + 1}: {chosen}: placements did not move within 30 s", flush=True)
                        continue
                    moves.append(moved)
                    print(f"shaped round {n + 1}: {chosen}: first report with a backlog after "
                          f"{'-' if seen is None else f'{seen * 1e3:.0f} ms'}, placement moved after {moved * 1e3:.0f} ms "
                          f"(the queue {at_move:.0%} full in the replica's latest report then)", flush=True)
                if moves:
                    print(f"shaped port -> placement moved: median {statistics.median(moves) * 1e3:.0f} ms, "
                          f"range {min(moves) * 1e3:.0f}-{max(moves) * 1e3:.0f} ms over {len(moves)} rounds", flush=True)
        finally:
            _stop(list(agents.values()))
        if args.heal:
            th.stop()
            _heal_rounds(bundle, fleet, etcd, rounds)
    finally:
        _stop(load)
        th.stop()
        etcd.stop()
        fleet.destroy()


if __name__ == "__main__":
    main()
