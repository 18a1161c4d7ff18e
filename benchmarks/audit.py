"""Audit log benchmark: decision throughput with the audit log on vs off, and `verify`
over a large log.

1. Throughput. A pool of worker threads (as a gRPC server's) makes decisions: a scan of
   the fleet's attribute views for the request's predicates (region, TPM, SLO, bandwidth:
   the matcher's semantics without its index), then the real `policyc.placer.Placer` on a
   simulated 8-host cluster picks the GPU and share. "Off" stops there. "On" also
   builds the DecisionRecord (with resource estimates from the contract and placement) and
   calls `append_decision`, which returns only once the record is durable (fsync'd,
   group-committed). Both phases run in the same process, alternating, and the ratio of
   medians is printed (floor 0.9).
2. Verify. Writes M records through the real writer, then times `verify` over them (floor
   20 s for 1,000,000).

Usage: .venv/bin/python benchmarks/audit.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from policyc.audit.accounting import estimate_resources, measured
from policyc.audit.log import AuditLog
from policyc.audit.records import DecisionRecord, Latency, MatchedRule, Placement
from policyc.audit.verify import verify
from policyc.compiler.bundle import Bundle, Compute, Contract, Dependencies, GpuClass, Interval, Memory, Slo, SourceRef
from policyc.matcher.instance import Instance, attributes
from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster

HERE = SourceRef(file="policies/recommender.contract", line=3, col=1)
GPU = GpuClass(name="A100-80G", arch="ampere", peak_flops=(("fp16", 312e12),), hbm_bandwidth=2.0e12, memory=80e9, origin=HERE)
CONTRACT = Contract(
    name="recommender",
    version="2.1",
    compute=Compute(flops=Interval(lo=1.2e12, hi=1.8e12), per="request", tokens=128),
    memory=Memory(bandwidth_min=80e9, burst_max=0.2),
    dependencies=Dependencies(),
    slo=Slo(latency=0.2),
    origin=HERE,
)
BUNDLE = Bundle(compiler_version="bench", contracts=(CONTRACT,), gpu_catalog=(GPU,))
RULE = MatchedRule(id="finance.require_tpm", origin=SourceRef(file="policies/finance.contract", line=12, col=5))


class Decider:
    """The stand-in for the decision service until `policyc.server` has an in-process
    path: matcher predicates by scan, then the real placer."""

    def __init__(self, hosts: int = 8) -> None:
        now = [0.0]
        self.sim = SimulatedCluster(seed=3, hosts=hosts, gpus_per_host=8)
        self.refresher = Refresher(self.sim, clock=lambda: now[0])
        self.placer = Placer(self.refresher, clock=lambda: now[0])
        self.refresher.tick()
        self.pool = []
        for s in self.sim.gpu_slots():
            inst = Instance(id=f"rec@{s.host}/{s.gpu}", model="recommender", deployment=s.to_deployment())
            self.pool.append((inst, attributes(inst, CONTRACT, BUNDLE)))
        self.regions = sorted({a["region"] for _, a in self.pool})

    def decide(self, region: str, slo: float) -> tuple[PlacementPlan | None, float, float]:
        t0 = time.perf_counter()
        cands = [inst for inst, a in self.pool if a["region"] == region and a["slo_latency"] <= slo and a["bandwidth"] <= 2e12 and a["model"] == "recommender"]
        t1 = time.perf_counter()
        plan = self.placer.place(cands, slo, CONTRACT, ingress=f"ingress/{region}")
        t2 = time.perf_counter()
        return (plan if isinstance(plan, PlacementPlan) else None), t1 - t0, t2 - t1


def record_for(d: Decider, plan: PlacementPlan | None, n: int, region: str, match_s: float, place_s: float) -> DecisionRecord:
    return DecisionRecord(
        time=time.time(),
        decision_id=f"d-{n}",
        tenant="acme",
        model="recommender",
        request={"X-SLO-Latency": "200ms", "X-Data-Region": region, "Authorization": "Bearer abcdef0123456789"},
        variables={"slo_latency": 0.2, "data_region": region},
        bundle_hash="sha256:" + "ab" * 32,
        outcome="admitted" if plan else "rejected",
        reason=None if plan else "no placement",
        matched_rules=(RULE,),
        placement=Placement(instance=plan.instance_id, host=plan.host, gpu=plan.gpu, gpu_model=plan.gpu_model, region=region, share=plan.share, predicted_latency=plan.latency.total) if plan else None,
        latency=Latency(total=match_s + place_s, stages={"match": match_s, "place": place_s}),
        resources=estimate_resources(CONTRACT, GPU, plan.share, network_bytes=measured(4096, "kernel_flow_counters")) if plan else estimate_resources(CONTRACT, GPU, 1.0),
    )


def run_phase(d: Decider, log: AuditLog | None, threads: int, seconds: float, wait: bool = True) -> tuple[float, list[float]]:
    stop = time.perf_counter() + seconds
    counts = [0] * threads
    acks: list[float] = []

    def work(w: int) -> None:
        n = 0
        local_acks = []
        while time.perf_counter() < stop:
            region = d.regions[(w + n) % len(d.regions)]
            plan, m, p = d.decide(region, 0.2)
            if log is not None:
                rec = record_for(d, plan, w * 10_000_000 + n, region, m, p)
                t = time.perf_counter()
                if wait:
                    log.append_decision(rec)
                    local_acks.append(time.perf_counter() - t)
                else:
                    log.submit_decision(rec)
            n += 1
        counts[w] = n
        acks.extend(local_acks)

    ts = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0), acks


def throughput(tmp: Path, hosts: int, threads: int, rounds: int, seconds: float) -> None:
    d = Decider(hosts)
    off, on, acks, early = [], [], [], []
    with AuditLog.open(tmp / "throughput.db", redact=("authorization",)) as log:
        run_phase(d, log, threads, 0.5)  # warm-up
        c0, s0 = log.commits, log.last_seq
        for _ in range(rounds):
            off.append(run_phase(d, None, threads, seconds)[0])
            rate, a = run_phase(d, log, threads, seconds)
            on.append(rate)
            acks.extend(a)
            early.append(run_phase(d, log, threads, seconds, wait=False)[0])
        commits, records = log.commits - c0, log.last_seq - s0
    acks.sort()
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"decisions: predicate scan + policyc.placer on a simulated {hosts}-host x 8-GPU cluster, {threads} worker threads, {rounds} alternating {seconds:g} s phases")
    print(f"  audit off: {m_off:,.0f} decisions/s  (phases: {', '.join(f'{x:,.0f}' for x in off)})")
    print(f"  audit on : {m_on:,.0f} decisions/s  (phases: {', '.join(f'{x:,.0f}' for x in on)})")
    print(f"  ratio on/off: {m_on / m_off:.3f}  (floor 0.9)")
    m_early = statistics.median(early)
    print(f"  audit on, decision returned before its record is durable (submit_decision): {m_early:,.0f} decisions/s, ratio {m_early / m_off:.3f}")
    print(f"  durable acknowledgement latency: p50 {acks[len(acks) // 2] * 1e3:.2f} ms, p99 {acks[int(len(acks) * 0.99)] * 1e3:.2f} ms; "
          f"{records / max(commits, 1):.1f} records per commit (group commit, synchronous=FULL)")


def verify_bench(tmp: Path, n: int) -> None:
    path = tmp / "verify.db"
    d = Decider(2)
    plan, m, p = d.decide(d.regions[0], 0.2)
    template = record_for(d, plan, 0, d.regions[0], m, p)
    base = time.time()
    # Bodies are serialised once from a real record and varied by decision id and time, then
    # go through the real writer (chain, SQLite, checkpoints): this part measures verify,
    # and building a million pydantic records would only measure pydantic.
    head, tail = template.model_dump_json(exclude_none=True).split('"decision_id":"d-0"', 1)
    t0 = time.perf_counter()
    with AuditLog.open(path, checkpoint_every=10_000, durability="normal") as log:
        last = None
        for i in range(n):
            body = f'{head}"decision_id":"d-{i}"{tail}'.replace(f'"time":{template.time!r}', f'"time":{base + i * 1e-3!r}', 1)
            last = log._enqueue(body.encode())
            if i % 50_000 == 49_999:
                last.wait()
        if last is not None:
            last.wait()
    write_s = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in tmp.glob("verify.db*")) / 1e6
    t0 = time.perf_counter()
    report = verify(path)
    verify_s = time.perf_counter() - t0
    assert report.ok and report.entries == n, report.problems
    print(f"verify: {n:,} records ({size:,.0f} MB), written in {write_s:.1f} s ({n / write_s:,.0f} records/s through the writer, synchronous=NORMAL for the fill)")
    print(f"  verify: {verify_s:.2f} s ({n / verify_s:,.0f} records/s), floor 20 s for 1,000,000"
          + (f"; scaled to 1,000,000: {verify_s * 1e6 / n:.1f} s" if n != 1_000_000 else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter phases and 100,000 records for verify")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        tmp = Path(d)
        throughput(tmp, args.hosts, args.threads, rounds=3, seconds=1.0 if args.quick else 2.0)
        verify_bench(tmp, 100_000 if args.quick else 1_000_000)


if __name__ == "__main__":
    main()
