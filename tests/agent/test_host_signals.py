"""Signals measured on the host, on the namespace fleet (three hosts, each with a real
`policyc agent run` measuring its own namespace every 200 ms, etcd and a replica in the root
namespace):

- the collector reads the kernel: a tbf qdisc filled by traffic shows its backlog as a
  fraction of the qdisc's limit, the interface's throughput, a busy process's CPU, RSS and
  run-queue delay;
- the replica merges each host's report into its telemetry with its age (ports' columns and
  readings); shaping the uplink of the host the placement chose (`tc` tbf at 1 Mbit/s, traffic
  filling its queue) moves new placements off it within two of the placer's ticks of the
  report that showed the backlog, and the plan names the measured backlog and its age;
- a host whose agent stops reporting (SIGSTOP) is reported stale and its figures are not
  used; the agent reports its own period and jitter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Iterator

import grpc
import numpy as np
import pytest
from agent_rig import eventually, new_prefix, replica

from policyc.cluster.host_signals import Collector, backlog_fraction
from policyc.placer.framework import TickInputs
from policyc.placer.paths import ingress_rows
from policyc.placer.signals import REGISTRY
from policyc.cluster.local_etcd import LocalEtcd
from policyc.cluster.netns_fleet import NetnsFleet
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

HOSTS = ("host-0002", "host-0005", "host-0006")
POLICYC = [sys.executable, "-m", "policyc.cli.main"]
SENDER = ("import socket,sys,time\n"  # up to ~5 Mbit/s of UDP at the root namespace: several times the shaped rate
          "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
          "while True:\n"
          "    try: s.sendto(b'x'*1400,(sys.argv[1],9))\n"
          "    except OSError: pass\n"
          "    time.sleep(0.002)\n")
BUSY = "import time\nwhile True:\n    sum(range(20000)); time.sleep(0.001)\n"


@pytest.fixture(scope="module")
def fleet() -> Iterator[NetnsFleet]:
    f = NetnsFleet.create(HOSTS)
    try:
        yield f
    finally:
        f.destroy()


@pytest.fixture(scope="module")
def fleet_etcd(fleet: NetnsFleet) -> Iterator[LocalEtcd]:
    etcd = LocalEtcd.start(1, also_listen=fleet.gateway)
    yield etcd
    etcd.stop()


def _shape(fleet: NetnsFleet, host: str) -> None:
    out = fleet.run(host, ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "1mbit", "burst", "16kb",
                           "limit", "100kb"], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr


def _shape_data_class(fleet: NetnsFleet, host: str, control_port: int) -> None:
    """The host's data traffic through a 1 Mbit/s HTB class with a 100 kB fifo, its control
    traffic (the agent's etcd connection) in a class of its own: as on a host whose
    management traffic is classed apart (a congested data port must not delay the reports
    about it; with one shared queue they arrive seconds late and are, rightly, stale)."""
    for argv in (["qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb", "default", "20", "r2q", "1000"],
                 ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "100mbit"],
                 ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", "1mbit", "ceil", "1mbit"],
                 ["qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "bfifo", "limit", "100000"],
                 ["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip", "dport",
                  str(control_port), "0xffff", "flowid", "1:10"]):
        out = fleet.run(host, ["tc", *argv], capture_output=True, text=True, timeout=20)
        assert out.returncode == 0, out.stderr


def _unshape(fleet: NetnsFleet, host: str) -> None:
    fleet.run(host, ["tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True, timeout=20)


def _stop(procs: list["subprocess.Popen[str]"]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def test_the_collector_reads_backlog_throughput_and_a_process_from_the_kernel(fleet: NetnsFleet) -> None:
    host = "host-0006"
    _shape(fleet, host)
    sender = fleet.popen(host, [sys.executable, "-c", SENDER, fleet.gateway])
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    probe = ("import json,sys,time\nfrom policyc.cluster.host_signals import Collector\n"
             "c=Collector({'busy':int(sys.argv[1])})\nc.sample();time.sleep(1.0)\nprint(json.dumps(c.sample()))\n")
    try:
        time.sleep(1.0)  # the queue fills (2 Mbit/s offered, 1 Mbit/s drained)
        out = fleet.run(host, [sys.executable, "-c", probe, str(busy.pid)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
    finally:
        _stop([sender, busy])
        _unshape(fleet, host)
    eth0 = got["interfaces"]["eth0"]
    assert eth0["qdisc_tbf"] == 1.0 and eth0["limit_bytes"] == 102400
    assert eth0["backlog_bytes"] > 50_000 and backlog_fraction(eth0) > 0.5  # a full queue, as `tc -s qdisc` shows
    assert 5_000 < eth0["tx_Bps"] < 200_000  # drained by the 1 Mbit/s (125 kB/s) shaper, never faster
    assert got["interfaces"]["lo"]["up"] == 1.0 and "limit_bytes" not in got["interfaces"]["lo"]
    p = got["processes"]["busy"]
    assert p["cpu_per_s"] > 0.01 and p["rss_bytes"] > 1_000_000 and p["runq_wait_per_s"] >= 0.0
    # in the root namespace: the same collector, no namespace needed; a process that is gone has no figure
    c = Collector({"gone": busy.pid})
    assert c.sample()["processes"] == {}
    c.close()


def _decide(port: int) -> pb.Decision:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return pb_grpc.DecisionsStub(ch).Decide(pb.DecideRequest(headers={"X-Model": "recommender"}), timeout=30)


def _explain(port: int) -> pb.Explanation:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return pb_grpc.DecisionsStub(ch).Explain(pb.DecideRequest(headers={"X-Model": "recommender"}), timeout=30)


def _register(port: int, inst, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    dep = {k: v for k, v in inst.deployment.model_dump().items() if k in pb.Deployment.DESCRIPTOR.fields_by_name}
    dep["endpoint"] = endpoint
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        pb_grpc.DecisionsStub(ch).RegisterInstance(
            pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep)), timeout=60)


def test_a_shaped_uplink_moves_placements_off_its_host_and_a_silent_agent_is_stale(bundle, fleet, fleet_etcd) -> None:  # type: ignore[no-untyped-def]
    prefix = new_prefix()
    r0 = replica(bundle, fleet_etcd, "r0", prefix)
    url = f"http://{fleet.gateway}:{fleet_etcd.members[0].client_port}"
    busy = {h: fleet.popen(h, [sys.executable, "-c", BUSY]) for h in HOSTS[:1]}
    agents = {}
    procs: list["subprocess.Popen[str]"] = list(busy.values())
    try:
        for h in HOSTS:
            argv = [*POLICYC, "agent", "run", "--host", h, "--etcd", url, "--etcd-prefix", prefix, "--signal-period", "0.2",
                    "--lease-ttl", "60"]  # the silent (stopped) agent's keys stay while the status below is read, however loaded
            if h in busy:
                argv += ["--model-server", f"server-a={busy[h].pid}"]
            agents[h] = fleet.popen(h, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(agents[h])
        for h, p in agents.items():
            assert p.stdout is not None
            line = p.stdout.readline()
            assert f"host {h} ready" in line, line + (p.stderr.read() if p.poll() is not None and p.stderr else "")
        book = r0.server.replica.host_signals
        eventually(lambda: set(book.reports) == set(HOSTS), 30, step=0.1)
        slots = r0.server.cluster.gpu_slots()
        rec = {i.deployment.host: i for i in admissible_fleet(bundle, slots, models=["recommender"])}
        for h in HOSTS:
            _register(r0.server.port, rec[h], f"{fleet.hosts[h].address}:8000")
        refresher = r0.server.refresher

        # merged with its age: each host's ports carry its measured figures, the host its servers' and the agent's own
        def fresh_frame():  # type: ignore[no-untyped-def]
            return refresher.current().frame
        t = refresher.current().topology
        eventually(lambda: all(f"{h}/mlx5_0" in fresh_frame().measured for h in HOSTS), 20, step=0.1)
        m = fresh_frame().measured
        for h in HOSTS:
            port = m[f"{h}/mlx5_0"]
            assert 0 <= port.age_s < 2.0 and port.values["port_up"] == 1.0 and "port_backlog_bytes" in port.values
        held: list = []  # the reading that met the condition (a loaded machine may lapse an agent's lease for a moment)

        def busy_measured() -> bool:
            r = fresh_frame().measured.get("host-0002")
            held[:] = [r] if r is not None else []
            return r is not None and r.values.get("process.server-a.cpu_per_s", 0) > 0.05
        eventually(busy_measured, 20, step=0.1)
        host_reading = held[0]
        assert host_reading.values["process.server-a.rss_bytes"] > 1e6 and "process.server-a.runq_wait_per_s" in host_reading.values
        assert 0.15 < host_reading.values["agent.period_mean_s"] < 0.5 and host_reading.values["agent.jitter_s"] >= 0
        assert host_reading.values["agent.cpu_per_tick_s"] > 0

        first = _decide(r0.server.port)
        assert first.outcome == pb.ADMITTED, first
        chosen = first.placement.host
        assert chosen in HOSTS

        # shape the chosen host's uplink (its data class) and fill its queue
        _shape_data_class(fleet, chosen, fleet_etcd.members[0].client_port)
        procs.append(fleet.popen(chosen, [sys.executable, "-c", SENDER, fleet.gateway]))
        key = f"{chosen}/mlx5_0"

        def full() -> bool:
            r = book.reports.get(chosen)
            v = r.interfaces.get("eth0", {}) if r else {}
            return (backlog_fraction(v) or 0.0) > 0.8
        eventually(full, 30, step=0.02)
        seen_at = refresher.current().version  # the placer's tick when the replica held the report
        moved = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            d = _decide(r0.server.port)
            if d.placement.host and d.placement.host != chosen:
                moved = d
                break
            # within two ticks: no placement on the shaped host from the placer's second tick after the report
            assert d.placement.snapshot_version < seen_at + 2, (d.placement.snapshot_version, seen_at)
            time.sleep(0.15)  # a decision reserves its share until the next tick: a few per tick
        assert moved is not None, f"placements stayed on {chosen}"
        plan = _explain(r0.server.port).decision.placement  # the same placement, with the placer's reasons and refusals
        assert plan.host != chosen
        named = [line for line in plan.reasons if line.startswith(f"measured port backlog: {plan.host}/mlx5_")]
        assert named and "qdisc backlog" in named[0] and "ms ago" in named[0], plan.reasons  # its own ports' backlog and age
        for r in plan.rejected:  # a GPU of the shaped host among the candidates is refused, naming the backlog and its age
            if r.gpu.startswith(chosen + "/"):
                assert r.constraint == "port_backlog" and key in r.detail and "ms ago" in r.detail, r
        # the signal on the snapshot the placements use: every GPU of the shaped host refused, the backlog named
        gpus = np.array([i for i, k in enumerate(t.gpu_keys) if k.startswith(chosen + "/")], dtype=np.int64)
        notes: list[str | None] = []

        def refused() -> bool:
            snap = refresher.current()
            col = REGISTRY["port_backlog"].reference(TickInputs(snap, snap.thresholds, gpus, ingress_rows(snap, None)[gpus]))
            notes.append(REGISTRY["port_backlog"].plan_note(snap, int(gpus[0])))
            return col.fail is not None and bool(col.fail.all())
        eventually(refused, 10, step=0.05)
        note = notes[-1]
        assert note is not None and key in note and "qdisc backlog" in note and "> 80%" in note and "ms ago" in note, note
        elsewhere = 0
        for _ in range(6):  # and it stays off while the port is congested
            time.sleep(0.3)
            elsewhere += _decide(r0.server.port).placement.host != chosen
        assert elsewhere >= 5
        assert fresh_frame().port_watermark[t.port_index[key]] > 0.8  # the same column the simulator's watermark feeds

        # a host whose agent goes silent: reported stale, its figures not used
        silent = next(h for h in HOSTS if h != chosen)
        agents[silent].send_signal(signal.SIGSTOP)
        try:
            eventually(lambda: book.status()[silent]["stale"], 15, step=0.05)
            eventually(lambda: any(n.startswith(f"host {silent}: its agent's last report is") for n in fresh_frame().notes), 10,
                       step=0.05)
            reading = fresh_frame().measured[f"{silent}/mlx5_0"]
            assert reading.age_s > reading.values["stale_after_s"]
            # what an operator sees: each host's signals, how old, its agent's period and jitter
            out = subprocess.run([*POLICYC, "cluster", "status", "--etcd", url, "--etcd-prefix", prefix, "--format", "json"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            hosts = {h["host"]: h for h in json.loads(out.stdout)["hosts"]}
            assert hosts[silent]["signals_stale"] and not hosts[chosen]["signals_stale"]
            assert hosts[chosen]["signals_age_s"] < 2 and 100 < hosts[chosen]["period_ms"] < 400 and hosts[chosen]["jitter_ms"] >= 0
        finally:
            agents[silent].send_signal(signal.SIGCONT)
        eventually(lambda: not book.status()[silent]["stale"], 15, step=0.05)
    finally:
        _stop(procs)
        for h in HOSTS:
            _unshape(fleet, h)
        r0.stop()


def test_agent_flags_are_checked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = [*POLICYC, "agent", "run", "--host", "host-0002", "--etcd", "http://127.0.0.1:9"]
    for extra, words in ((["--cpus", "x-y"], "is not a CPU number"), (["--sched-fifo", "120"], "1..99"),
                         (["--model-server", "vllm"], "NAME=PID"), (["--signal-period", "0.001"], "between 0.01 and 60 s")):
        out = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=240)
        assert out.returncode == 2 and words in out.stderr, out.stderr
    # a CPU that is not there: the agent does not run unisolated
    etcd = LocalEtcd.start(1)
    try:
        out = subprocess.run([*POLICYC, "agent", "run", "--host", "host-0002", "--etcd", etcd.endpoints[0],
                              "--cpus", str((os.cpu_count() or 1) + 64)], capture_output=True, text=True, timeout=240)
        assert out.returncode == 2 and "could not apply --cpus" in out.stderr, out.stderr
        # isolated: every thread of the agent SCHED_FIFO on CPU 0, and it reports its own period and jitter
        store_prefix = new_prefix()
        agent = subprocess.Popen([*POLICYC, "agent", "run", "--host", "host-0002", "--etcd", etcd.endpoints[0], "--etcd-prefix",
                                  store_prefix, "--sched-fifo", "10", "--cpus", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        try:
            assert agent.stdout is not None and "ready" in agent.stdout.readline()
            tids = [int(t) for t in os.listdir(f"/proc/{agent.pid}/task")]
            assert tids and all(os.sched_getscheduler(t) == os.SCHED_FIFO and os.sched_getaffinity(t) == {0} for t in tids)
            got = subprocess.run(["etcdctl", "--endpoints", etcd.endpoints[0], "get", "--print-value-only",
                                  f"{store_prefix}signals/host-0002"], capture_output=True, text=True, timeout=30)
            deadline = time.monotonic() + 20
            while "period_mean_s" not in got.stdout and time.monotonic() < deadline:
                time.sleep(0.3)
                got = subprocess.run(["etcdctl", "--endpoints", etcd.endpoints[0], "get", "--print-value-only",
                                      f"{store_prefix}signals/host-0002"], capture_output=True, text=True, timeout=30)
            stats = json.loads(got.stdout)["agent"]
            assert stats["period_s"] == 0.2 and 0.1 < stats["period_mean_s"] < 0.4 and stats["jitter_s"] >= 0
        finally:
            _stop([agent])
    finally:
        etcd.stop()
