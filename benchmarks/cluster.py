"""Replicas sharing one fleet through a real 3-member etcd cluster on loopback.

    .venv/bin/python benchmarks/cluster.py [--quick] [--registrations 200] [--seconds 5]

Reports:
- registration-to-visible latency on every replica (p50/p99): an instance put by a model
  server's agent (`InstanceAgent`) until each replica's registry serves it (three
  in-process replicas, each on its own event loops; the time is taken where the watch's
  change is applied on the serving loop);
- rollout convergence: `roll_out` (compare-and-swap) until every replica has verified and
  swapped, alternating two bundles;
- failover: an etcd leader killed until a registration lands again; the policyc leader
  crashing (no goodbye) until another replica holds the fencing token; a model server
  dying until no replica serves it (both bound by the lease TTL, 2 s here);
- decisions/s with 1, 2 and 3 replicas as separate `policyc serve --etcd` processes, each
  loaded by its own client process (closed loop, 16 in flight), beside one `policyc serve`
  with no store in the same run (the ratio says what the store costs the decision path:
  nothing, decisions never touch it). On a 2-core machine the replicas and their clients
  share the cores, so the total cannot grow much; a machine with a core per replica (and
  per client) should scale close to linearly, since replicas share nothing on the
  decision path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from policyc.client import operator_channel
from policyc.cluster.agent import InstanceAgent
from policyc.cluster.config import FleetConfig
from policyc.cluster.etcd_store import EtcdStore
from policyc.cluster.keys import Keys
from policyc.cluster.local_etcd import LocalEtcd, free_ports
from policyc.cluster.replica import Replica
from policyc.cluster.shared_engine import SharedRegistryEngine
from policyc.compiler import bundle_io
from policyc.compiler.pipeline import compile_paths
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

REPO = Path(__file__).resolve().parents[1]
SMALL = ClusterSpec(seed=1, hosts=8, gpus_per_host=4, hosts_per_rack=4)
TTL = 2


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def rep(th: ServerThread) -> Replica:
    r = th.server.replica
    assert r is not None
    return r


def slots(th: ServerThread) -> list:  # type: ignore[type-arg]
    assert th.server.cluster is not None
    return list(th.server.cluster.gpu_slots())


def replica(bundle, etcd: LocalEtcd, name: str, prefix: str) -> ServerThread:  # type: ignore[no-untyped-def]
    fleet = FleetConfig(etcd=tuple(etcd.endpoints), name=name, prefix=prefix, lease_ttl=TTL, report_interval=0.5)
    th = ServerThread(DecisionServer(bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE, watch_gpus=False,
                                                         fleet=fleet)))
    th.start()
    return th


def visible_latency(bundle, etcd: LocalEtcd, n: int) -> None:  # type: ignore[no-untyped-def]
    prefix = f"/bench-{time.monotonic_ns()}/"
    reps = [replica(bundle, etcd, f"r{i}", prefix) for i in range(3)]
    seen: dict[tuple[int, str], float] = {}
    for i, th in enumerate(reps):
        eng = th.server.engine
        assert isinstance(eng, SharedRegistryEngine)
        orig = eng.apply_register

        def timed(inst, score, _orig=orig, _i=i):  # type: ignore[no-untyped-def]
            _orig(inst, score)
            seen[(_i, inst.id)] = time.perf_counter()
        eng.apply_register = timed  # type: ignore[method-assign]  # timed where the watch's change is applied
    fleet = admissible_fleet(bundle, slots(reps[0]), models=["fraud-scorer", "fraud-scorer-lite", "recommender"])
    fleet = (fleet * (n // max(1, len(fleet)) + 1))[:n]
    fleet = [f.model_copy(update={"id": f"{f.id}#{k}"}) for k, f in enumerate(fleet)]

    async def go() -> dict[str, float]:
        store = EtcdStore(etcd.endpoints)
        await store.connect()
        started = {}
        agents = []
        for inst in fleet:
            a = InstanceAgent(store, inst, ttl=30, keys=Keys(prefix))
            started[inst.id] = time.perf_counter()
            await a.start()
            agents.append(a)
            await asyncio.sleep(0.005)
        await asyncio.sleep(1.0)
        for a in agents:
            await a.stop()
        await store.close()
        return started

    started = asyncio.run(go())
    for i in range(3):
        lat = [seen[(i, iid)] - t for iid, t in started.items() if (i, iid) in seen]
        print(f"  replica r{i}: {len(lat)}/{len(started)} visible, p50 {ms(pct(lat, 0.5))}, p99 {ms(pct(lat, 0.99))}, "
              f"max {ms(max(lat))}")
    allv = [max(seen[(i, iid)] for i in range(3)) - t for iid, t in started.items() if all((i, iid) in seen for i in range(3))]
    print(f"  on every replica: p50 {ms(pct(allv, 0.5))}, p99 {ms(pct(allv, 0.99))}")
    for th in reps:
        th.stop()


def rollout_convergence(bundle, second, etcd: LocalEtcd, rounds: int) -> None:  # type: ignore[no-untyped-def]
    prefix = f"/bench-{time.monotonic_ns()}/"
    reps = [replica(bundle, etcd, f"r{i}", prefix) for i in range(3)]
    times = []
    cur = bundle
    for k in range(rounds):
        nxt = second if cur is bundle else bundle
        t0 = time.perf_counter()
        rep(reps[k % 3]).roll_out(nxt, expect=cur.content_hash)
        while not all(th.server.state.bundle_hash == nxt.content_hash for th in reps):
            time.sleep(0.001)
        times.append(time.perf_counter() - t0)
        cur = nxt
    print(f"  {rounds} rollouts: p50 {ms(pct(times, 0.5))}, max {ms(max(times))} (verify + index rebuild on 3 replicas)")
    for th in reps:
        th.stop()


def failovers(bundle, etcd: LocalEtcd) -> None:  # type: ignore[no-untyped-def]
    prefix = f"/bench-{time.monotonic_ns()}/"
    reps = [replica(bundle, etcd, f"r{i}", prefix) for i in range(3)]
    fleet = admissible_fleet(bundle, slots(reps[0]), models=["fraud-scorer"])
    dead = etcd.leader()
    etcd.kill(dead)
    t0 = time.perf_counter()
    reps[1].server.engine.register(fleet[0])
    print(f"  etcd leader killed → next registration stored: {ms(time.perf_counter() - t0)}")
    etcd.restart(dead)
    leader = next(th for th in reps if rep(th).election.token)
    t0 = time.perf_counter()
    leader.call(rep(leader).crash())
    others = [th for th in reps if th is not leader]
    while not any(rep(th).election.token for th in others):
        time.sleep(0.005)
    print(f"  policyc leader crashed → another holds the fencing token: {ms(time.perf_counter() - t0)} (lease TTL {TTL} s)")

    async def model_server_dies() -> float:
        a = InstanceAgent.for_etcd(etcd.endpoints, fleet[1], ttl=TTL, prefix=prefix)
        await a.start()
        while not all(fleet[1].id in th.server.state.registry for th in others):
            await asyncio.sleep(0.005)
        await a.crash()
        t = time.perf_counter()
        while any(fleet[1].id in th.server.state.registry for th in others):
            await asyncio.sleep(0.005)
        return time.perf_counter() - t
    print(f"  model server died → served by no replica: {ms(asyncio.run(model_server_dies()))} (lease TTL {TTL} s)")
    for th in others:
        th.stop()
    leader.stop()


def _client(port: int, seconds: float, out: "mp.Queue[int]") -> None:
    async def go() -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            req = pb.DecideRequest(headers={"X-SLO-Latency": "150ms", "X-Data-Region": "us-west"})
            await stub.Decide(req)
            n = 0
            end = time.perf_counter() + seconds

            async def worker() -> None:
                nonlocal n
                while time.perf_counter() < end:
                    await stub.Decide(req)
                    n += 1
            await asyncio.gather(*(worker() for _ in range(16)))
            return n
    out.put(asyncio.run(go()))


def _serve(bpath: Path, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "policyc.cli.main", "serve", "--bundle", str(bpath), "--port", str(port),
                             "--enforcer", "off", "--sim-hosts", "32", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _wait_ready(port: int, want: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with operator_channel(f"127.0.0.1:{port}") as ch:
                d = pb_grpc.DecisionsStub(ch).Decide(pb.DecideRequest(headers={"X-SLO-Latency": "150ms", "X-Data-Region": "us-west"}), timeout=1)
                if want == 0 or d.candidates > 0:
                    return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"replica on port {port} not ready")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _phase(k: int, bpath: Path, etcd: LocalEtcd, fleet: list, seconds: float) -> tuple[float, float]:  # type: ignore[type-arg]
    """Decisions/s over `k` replica processes on etcd (k = 0: one process with no store),
    and the replicas' CPU milliseconds per decision (a figure other load disturbs less)."""
    prefix = f"/bench-{time.monotonic_ns()}/"
    ports = free_ports(max(1, k))
    procs = [_serve(bpath, port, ["--state-dir", "none"] if k == 0 else
                    ["--etcd", *etcd.endpoints, "--etcd-prefix", prefix, "--name", f"t{i}", "--lease-ttl", str(TTL)])
             for i, port in enumerate(ports)]
    try:
        _wait_ready(ports[0], 0)
        with operator_channel(f"127.0.0.1:{ports[0]}") as ch:
            s = pb_grpc.DecisionsStub(ch)
            for inst in fleet:
                dep = {f: v for f, v in inst.deployment.model_dump().items() if f in pb.Deployment.DESCRIPTOR.fields_by_name}
                s.RegisterInstance(pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep)))
        for port in ports:
            _wait_ready(port, 1)
        time.sleep(1.0)
        ctx = mp.get_context("spawn")  # this process runs gRPC threads: never fork it
        q = ctx.Queue()
        clients = [ctx.Process(target=_client, args=(port, seconds, q)) for port in ports]
        cpu0 = sum(_cpu_s(p.pid) for p in procs)
        for c in clients:
            c.start()
        total = sum(q.get(timeout=seconds + 60) for _ in clients)
        cpu = sum(_cpu_s(p.pid) for p in procs) - cpu0
        for c in clients:
            c.join()
        return total / seconds, cpu * 1e3 / max(1, total)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(20)


def throughput(bundle, etcd: LocalEtcd, seconds: float, tmp: Path, rounds: int = 1) -> None:  # type: ignore[no-untyped-def]
    bpath = tmp / "bundle.json"
    bundle_io.write(bundle, bpath)
    probe = DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=32, gpus_per_host=4, hosts_per_rack=4),
                                               enforcer=EnforcerMode.OFF, start_refresher=False))
    fleet = admissible_fleet(bundle, probe.cluster.gpu_slots())  # type: ignore[union-attr]
    probe.refresher.stop()
    runs: dict[int, list[float]] = {0: [], 1: [], 2: [], 3: []}
    cpu: dict[int, list[float]] = {0: [], 1: [], 2: [], 3: []}
    order = [0, 1, 2, 3]  # 0: one process with no store
    for r in range(rounds):  # phases alternate direction each round, so drift in the machine's load hits all alike
        for k in (order if r % 2 == 0 else order[::-1]):
            rate, cpu_ms = _phase(k, bpath, etcd, fleet, seconds)
            runs[k].append(rate)
            cpu[k].append(cpu_ms)
    results = {k: statistics.median(v) for k, v in runs.items()}
    cpus = {k: statistics.median(v) for k, v in cpu.items()}
    base = results[0]
    print(f"  one process, no store:   {results[0]:8.0f} decisions/s (1.00x), {cpus[0]:.3f} CPU ms/decision  [{len(fleet)} instances]")
    for k in (1, 2, 3):
        print(f"  {k} replica(s) on etcd:    {results[k]:8.0f} decisions/s ({results[k] / base:.2f}x of one process, "
              f"{results[k] / results[1]:.2f}x of one replica), {cpus[k]:.3f} CPU ms/decision")
    print(json.dumps({"decisions_per_s_median": results, "runs": runs, "cpu_ms_per_decision": cpu}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--registrations", type=int, default=200)
    ap.add_argument("--rollouts", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3, help="throughput rounds (median reported)")
    ap.add_argument("--only", choices=("visible", "rollout", "failover", "throughput"), help="run one part")
    args = ap.parse_args()
    if args.quick:
        args.registrations, args.rollouts, args.seconds, args.rounds = 50, 4, 2.0, 1
    import logging

    logging.basicConfig(level=logging.ERROR)
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.bundle is not None
    bundle = r.bundle
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for f in (REPO / "policies").glob("*.contract"):
            text = f.read_text()
            (tmp / f.name).write_text(text.replace("latency: <= 200 ms", "latency: <= 210 ms", 1)
                                      if f.name == "fraud-scorer-lite.contract" else text)
        second = compile_paths([str(tmp)], analyse=False).bundle
        assert second is not None
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
        with LocalEtcd.start(3) as etcd:
            if args.only in (None, "visible"):
                print(f"registration → visible ({args.registrations} instances, one agent each):")
                visible_latency(bundle, etcd, args.registrations)
            if args.only in (None, "rollout"):
                print("rollout convergence (3 replicas):")
                rollout_convergence(bundle, second, etcd, args.rollouts)
            if args.only in (None, "failover"):
                print("failover:")
                failovers(bundle, etcd)
            if args.only in (None, "throughput"):
                print(f"decisions/s ({args.seconds:g} s per phase, a client process per replica, 16 in flight each, "
                      f"median of {args.rounds} rounds):")
                throughput(bundle, etcd, args.seconds, tmp, args.rounds)
        print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
