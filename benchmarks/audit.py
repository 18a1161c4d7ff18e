"""Audit log benchmark: real decisions with the audit log on vs off, and `verify` over a
large log.

1. Throughput. The decision service's engine in process (`policyc.server`'s
   `DecisionServer` set up as `benchmarks/serve.py` does: the example policies, a simulated
   256-host x 8-GPU cluster, N registered instances, enforcer off), driven by worker
   threads as a gRPC server's thread pool would (`DecisionEngine.decide`), with four phases
   alternating in the same run:
   - off: decisions only;
   - server: what the product does, `server.audit_bridge.AuditBridge.decision`: the
     decision as the writer's struct (`wire_of`), handed over 128 at a time without
     waiting; the writer process validates, redacts, serialises, indexes and stores;
   - record: the former bridge, for comparison: build the pydantic `DecisionRecord`
     (`decision_record`, resource estimates) and `submit_decision` without waiting;
   - draft+ack: as server, and each decision waits until its record is durable (fsync'd).
   Ratios of medians to "off" are printed (floor 0.9 for "server").
2. Durability: what sync mode costs against group mode, through the product's whole path
   (gRPC Decide on `DecisionServer`s with `--audit-durability group` / `sync` and one with
   no log, each on its own event loop, driven in alternating phases by the same client
   threads): decisions/s and per-call p50/p99, with the same-run ratios.
3. Writer per gateway call (`--only writer`): the writer process alone, fed what the gateway's
   audited calls give it (a decision draft and an accounting record a call, handed over every
   50 ms) at the gateway benchmark's rates: its CPU per call, and that cost split into a fixed
   cost per commit and a cost per call.
4. Verify. Writes M records through the real writer process, rotating the log into S
   segments as it goes (`AuditLog.rotate`, as `policyc audit rotate` does), then times
   `verify` walking every segment (floor 10 s for 1,000,000), twice in the same run: split
   across one process per usable CPU (a segment of >= 50,000 entries is walked in chunks,
   `audit/verify_parallel.py`), then in one process; wall, CPU (walkers included) and load;
   then where a record's CPU goes (SQLite's row, sha256, the index columns), each part alone.
5. Export (`--only export`, or after verify): `policyc audit export`'s writer over the
   first E records of that log in each format (jsonl, csv, parquet), records per second,
   with the read-back checked (count and every hash).

Usage: .venv/bin/python benchmarks/audit.py [--quick] [--instances N] [--threads T] [--only durability|verify|export]
       [--segments S] [--export-records E]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Mapping

from policyc.audit.draft_encoder import wire_draft, wire_drafts
from policyc.audit.log import AuditLog
from policyc.audit.records import DecisionRecord
from policyc.audit.verify import verify
from policyc.server.app import DecisionServer
from policyc.server.audit_bridge import AuditBridge, decision_record, draft_of, wire_of
from policyc.server.decision import Decision, DecisionInput
from serve import REQUESTS, build_server  # the same service and request mix as benchmarks/serve.py

INPUTS = [DecisionInput(headers=h, attributes={}) for h in REQUESTS]


def make_server(instances: int) -> DecisionServer:
    warnings.simplefilter("ignore")
    server = build_server(instances)
    # Ticking topology, as in the service (on the refresher's own thread: decisions here
    # are called directly, with no serving loop): without it the snapshot goes stale within
    # a second and every decision becomes a (cheaper-to-audit, costlier-to-decide) refusal.
    server.refresher.start()
    return server


Sink = Callable[[Decision, Mapping[str, str]], None] | None


def writer_cpu(log: AuditLog) -> float:
    """CPU seconds the log's writer process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{log._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_phase(server: DecisionServer, sink: Sink, threads: int, seconds: float) -> tuple[float, float]:
    """(decisions per wall second, decisions per CPU second of this process) of `threads`
    workers for `seconds`; `sink` audits each decision. The second figure is steadier on a
    shared machine: other engineers' load takes wall time, not this process's CPU time."""
    engine = server.engine
    stop = time.perf_counter() + seconds
    counts = [0] * threads

    def work(w: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            k = (w + n) % len(INPUTS)
            d = engine.decide(INPUTS[k])
            if sink is not None:
                sink(d, REQUESTS[k])
            n += 1
        counts[w] = n

    ts = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    t0, c0 = time.perf_counter(), time.process_time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0), sum(counts) / (time.process_time() - c0)


def throughput(tmp: Path, instances: int, threads: int, rounds: int, seconds: float) -> None:
    t = time.perf_counter()
    server = make_server(instances)
    bundle = server.engine.state.bundle
    print(f"set-up: {len(server.engine.state.registry):,} instances registered, example policies, {time.perf_counter() - t:.1f} s")
    acks: list[float] = []
    lock = threading.Lock()
    with AuditLog.open(tmp / "throughput.db") as log:
        bridge = AuditBridge(log, bundle)

        def record(d: Decision, headers: Mapping[str, str]) -> None:
            log.submit_decision(decision_record(d, headers, bundle))

        def draft_ack(d: Decision, headers: Mapping[str, str]) -> None:
            t0 = time.perf_counter()
            log.submit_decision_draft(draft_of(d, headers, bundle)).wait()
            dt = time.perf_counter() - t0
            with lock:
                acks.append(dt)

        modes: dict[str, Sink] = {"off": None, "server": bridge.decision, "record": record, "draft+ack": draft_ack}
        phases: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        for sink in modes.values():
            run_phase(server, sink, threads, 0.3)  # warm-up: caches, the writer's first pydantic import
        marker = draft_of(server.engine.decide(INPUTS[0]), REQUESTS[0], bundle)

        def settle() -> tuple[float, int]:
            """Everything handed over is durable: (writer CPU so far, last seq)."""
            bridge.flush()
            log.submit_decision_draft(marker).wait()
            return writer_cpu(log), log.last_seq

        c0 = log.commits
        w0, s0 = settle()
        per_record: dict[str, list[float]] = {m: [] for m in modes if m != "off"}
        for _ in range(rounds):
            for mode, sink in modes.items():
                before = settle()
                rate, per_cpu = run_phase(server, sink, threads, seconds)
                after = settle()
                phases[mode].append(rate)
                cpu[mode].append(per_cpu)
                if mode in per_record:
                    per_record[mode].append((after[0] - before[0]) / max(1, after[1] - before[1]))
        w1, s1 = settle()
        commits, records, failures = log.commits - c0, s1 - s0, bridge.failures
        w_cpu = w1 - w0
    server.refresher.stop()
    acks.sort()
    off = statistics.median(phases["off"])
    print(f"decisions: DecisionEngine.decide in process, {threads} worker threads, {rounds} rounds of {len(modes)} alternating {seconds:g} s phases")
    off_cpu = statistics.median(cpu["off"])
    for mode, rates in phases.items():
        m, c = statistics.median(rates), statistics.median(cpu[mode])
        paired = statistics.median(r / o for r, o in zip(rates, phases["off"]))  # each round's phase against that round's "off"
        print(f"  {mode:9s}: {m:8,.0f} decisions/s  ratio {m / off:.3f} (paired by round {paired:.3f})  | per CPU second of the service: {c:7,.0f}  ratio {c / off_cpu:.3f}"
              f"  (wall phases: {', '.join(f'{x:,.0f}' for x in rates)})")
    print("  floor: ratio >= 0.9 with the log on (\"server\": AuditBridge.decision, the product's path)")
    print(f"  writer process: {w_cpu / max(records, 1) * 1e6:.0f} us CPU per record over all phases (validate drafts, serialise, hash, SQLite); "
          + ", ".join(f"{m} {statistics.median(v) * 1e6:.0f}" for m, v in per_record.items()) + " us (median per phase)")
    print(f"  durable acknowledgement (draft+ack): p50 {acks[len(acks) // 2] * 1e3:.2f} ms, p99 {acks[int(len(acks) * 0.99)] * 1e3:.2f} ms; "
          f"{records / max(commits, 1):.1f} records per commit over all audited phases (synchronous=FULL); {failures} records not stored")


def durability(tmp: Path, instances: int, threads: int, rounds: int, seconds: float) -> None:
    """Sync against group durability (and no audit log), through gRPC Decide."""
    import grpc

    from policyc.compiler.pipeline import compile_paths
    from policyc.server.app import ServerThread
    from policyc.server.config import AuditDurability, ClusterSpec, EnforcerMode, ServeConfig
    from policyc.server.fleet import admissible_fleet
    from policyc.server.proto import pb, pb_grpc

    warnings.simplefilter("ignore")
    bundle = compile_paths(["policies"], analyse=False).bundle
    assert bundle is not None
    cluster = ClusterSpec(seed=1, hosts=64, gpus_per_host=8, hosts_per_rack=8)
    modes = {"off": None, "group": AuditDurability.GROUP, "sync": AuditDurability.SYNC}
    servers: dict[str, ServerThread] = {}
    for name, mode in modes.items():
        cfg = ServeConfig(cluster=cluster, enforcer=EnforcerMode.OFF, watch_gpus=False, settle_heap=True,
                          audit_log=None if mode is None else tmp / f"durability-{name}.db",
                          audit_durability=mode or AuditDurability.GROUP)
        server = DecisionServer(bundle, cfg)
        assert server.cluster is not None
        base = admissible_fleet(bundle, server.cluster.gpu_slots())
        server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots(), replicas=max(1, -(-instances // len(base))))[:instances])
        servers[name] = ServerThread(server)
        servers[name].start()
    requests = [pb.DecideRequest(headers=h) for h in REQUESTS]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    lat: dict[str, list[float]] = {m: [] for m in modes}
    refused: dict[str, int] = dict.fromkeys(modes, 0)

    def phase(name: str, secs: float, keep: bool) -> None:
        port = servers[name].server.port
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range(threads)]
        stubs = [pb_grpc.DecisionsStub(c) for c in channels]
        times: list[list[float]] = [[] for _ in range(threads)]
        stop = time.perf_counter() + secs

        def work(w: int) -> None:
            stub, out, n = stubs[w], times[w], 0
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    stub.Decide(requests[(w + n) % len(requests)], timeout=10)
                    out.append(time.perf_counter() - t0)
                except grpc.RpcError as e:  # the audit gate closed (a writer starved past the window): counted
                    if keep:
                        refused[name] += 1
                    if "audit log" not in (e.details() or ""):
                        raise
                n += 1

        t0 = time.perf_counter()
        ts = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        for c in channels:
            c.close()
        if keep:
            done = [x for out in times for x in out]
            rates[name].append(len(done) / wall)
            lat[name].extend(done)

    for name in modes:
        phase(name, 0.5, keep=False)  # warm-up: channels, caches, the writers' first drafts
    for _ in range(rounds):
        for name in modes:
            phase(name, seconds, keep=True)
    lost = {n: (st.server.audit.lost if st.server.audit else 0) for n, st in servers.items()}
    for st in servers.values():
        st.stop()
    print(f"durability: gRPC Decide, {threads} client threads (one channel each), {instances:,} instances, "
          f"{rounds} rounds of {len(modes)} alternating {seconds:g} s phases")
    group = statistics.median(rates["group"])
    for name in modes:
        xs = sorted(lat[name])
        p50, p99 = xs[len(xs) // 2], xs[int(len(xs) * 0.99)]
        m = statistics.median(rates[name])
        print(f"  {name:5s}: {m:7,.0f} decisions/s (ratio to group {m / group:.3f}; phases {', '.join(f'{x:,.0f}' for x in rates[name])})  "
              f"per call p50 {p50 * 1e3:.2f} ms  p99 {p99 * 1e3:.2f} ms  ({len(xs):,} calls; {refused[name]} refused by the audit gate; "
              f"{lost[name]} records lost)")
    g, sy = sorted(lat["group"]), sorted(lat["sync"])
    print(f"  sync against group: rate x{statistics.median(rates['sync']) / group:.3f}, p50 x{sy[len(sy) // 2] / g[len(g) // 2]:.2f}, "
          f"p99 x{sy[int(len(sy) * 0.99)] / g[int(len(g) * 0.99)]:.2f}")


def template_record() -> DecisionRecord:
    server = make_server(2_000)
    d = server.engine.decide(INPUTS[0])
    server.refresher.stop()
    return decision_record(d, REQUESTS[0], server.engine.state.bundle).model_copy(update={"decision_id": "d-0"})


def verify_bench(tmp: Path, n: int, segments: int = 4) -> tuple[Path, float]:
    """Fill a log of `n` records in `segments` segments; time `verify` over it. Returns the
    log and its records' first time (record i is at base + i ms)."""
    path = tmp / "verify.db"
    template = template_record()
    base = time.time()
    per_segment = -(-n // segments)
    # Bodies are serialised once from a real record and varied by decision id and time, then
    # go through the real writer (chain, SQLite, checkpoints): this part measures verify,
    # and building a million pydantic records would only measure pydantic.
    head, tail = template.model_dump_json(exclude_none=True).split('"decision_id":"d-0"', 1)
    t0 = time.perf_counter()
    with AuditLog.open(path, checkpoint_every=10_000, durability="normal") as log:
        for lo in range(0, n, 1000):
            receipts = log.submit_bodies(
                f'{head}"decision_id":"d-{i}"{tail}'.replace(f'"time":{template.time!r}', f'"time":{base + i * 1e-3!r}', 1).encode()
                for i in range(lo, min(n, lo + 1000))
            )
            if lo % 50_000 == 49_000 or lo + 1000 >= n:
                receipts[-1].wait()
            if (lo + 1000) % per_segment == 0 and lo + 1000 < n:
                log.rotate()  # the records already handed over close this segment
    write_s = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in [*tmp.glob("verify.db*"), *tmp.glob("verify.db.segments/*")] if p.is_file()) / 1e6
    import resource

    def cpu() -> tuple[float, float]:  # this process (the lead's walk), and its finished children (verify's walkers)
        return tuple(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))  # type: ignore[return-value]

    from policyc.audit.verify_parallel import PARALLEL_FROM, usable_cpus

    # The same log both ways in one run, the chunked walk first: one process per usable CPU
    # (each chunk from the stored hash before it, stitched with a check at every boundary,
    # audit/verify_parallel.py), then one process (workers=1).
    runs = {}
    for name, workers in (("parallel", None), ("serial", 1)):
        load0 = os.getloadavg()[0]
        c0, t0 = cpu(), time.perf_counter()
        report = verify(path, workers=workers)
        wall, c1 = time.perf_counter() - t0, cpu()
        lead, walkers = c1[0] - c0[0], c1[1] - c0[1]
        runs[name] = (wall, lead + walkers, load0, os.getloadavg()[0], lead, walkers)
        assert report.ok and report.entries == n and report.segments == segments, (report.problems, report.segments)
    print(f"verify: {n:,} records in {report.segments} segments ({size:,.0f} MB), written in {write_s:.1f} s ({n / write_s:,.0f} records/s "
          "through the writer process, 1,000 bodies per pipe write, synchronous=NORMAL for the fill)")
    for name, (verify_s, verify_cpu, la, lb, lead, walkers) in runs.items():
        procs = ("1 process" if name == "serial" else f"{min(usable_cpus(), 8)} processes" if per_segment >= PARALLEL_FROM
                 else f"1 process: segments of {per_segment:,} entries are under the {PARALLEL_FROM:,} where it splits")
        print(f"  verify {name} ({procs}): {verify_s:.2f} s wall ({n / verify_s:,.0f} records/s), {verify_cpu:.2f} s CPU "
              f"({verify_cpu / n * 1e6:.1f} us a record; lead {lead:.2f} s, walker processes {walkers:.2f} s), load {la:.1f} -> {lb:.1f}; "
              "floor 10 s for 1,000,000"
              + (f"; scaled to 1,000,000: {verify_s * 1e6 / n:.1f} s" if n != 1_000_000 else ""))
    (ps, pc, *_), (ss, sc, *_) = runs["parallel"], runs["serial"]
    print(f"  parallel against serial: wall x{ss / ps:.2f} faster, CPU x{pc / sc:.2f} ({usable_cpus()} usable CPUs). Under load the"
          " wall is the share the scheduler gives this session, not its process count (autogroup: one share per session, "
          f"{open('/proc/sys/kernel/sched_autogroup_enabled').read().strip() == '1' and 'on' or 'off'} here); on idle cores the "
          f"split walk's wall is at least its busiest process's CPU, here about {max(runs['parallel'][4], runs['parallel'][5] / max(1, min(usable_cpus(), 8) - 1)):.1f} s")
    return path, base


def verify_parts(path: Path, n: int = 100_000) -> None:
    """Where a verified record's CPU goes, on the first `n` entries of the oldest closed
    segment, each part timed alone (this thread's CPU, best of 3): SQLite's rows with the
    chain's four columns and with the 15 index columns too; sha256 of each entry's chained
    bytes; the index columns re-derived from the body (msgspec, `index_columns.index_row`);
    then `verify_chain.walk` itself without and with the index check. What the parts
    cost is C (SQLite's row and Python's objects for its values, OpenSSL, msgspec): the
    floor of this walk in one process, whatever the loop around them."""
    import hashlib
    import struct

    from policyc.audit.index_columns import index_row
    from policyc.audit.segments import closed_segments
    from policyc.audit.store import CHAIN_SELECT, INDEXED_CHAIN_SELECT, connect_reader
    from policyc.audit.verify_chain import walk

    segs = closed_segments(path)
    conn = connect_reader(segs[0][1] if segs else path)
    first = conn.execute("SELECT min(seq) FROM entries").fetchone()[0]
    start = conn.execute("SELECT prev_hash FROM entries WHERE seq = ?", (first,)).fetchone()[0]
    where = f" WHERE seq < {first + n} ORDER BY seq"
    rows = conn.execute(CHAIN_SELECT + where).fetchall()
    pack, sha = struct.Struct(">Q").pack, hashlib.sha256

    def best(fn: Callable[[], object]) -> float:
        out = []
        for _ in range(3):
            t = time.thread_time()
            fn()
            out.append(time.thread_time() - t)
        return min(out) / len(rows) * 1e6

    def read(select: str) -> None:
        for _ in conn.execute(select + where):
            pass

    def hashes() -> None:  # each result dropped at once, as the walk does (a list of them would time the collector)
        for q, b, p, _ in rows:
            sha(p + pack(q) + b).digest()

    def columns() -> None:
        for _, b, _, _ in rows:
            index_row(b)

    parts = {
        "rows, chain columns": best(lambda: read(CHAIN_SELECT)),
        "rows, + 15 index columns": best(lambda: read(INDEXED_CHAIN_SELECT)),
        "sha256 of the chained bytes": best(hashes),
        "index columns from the body": best(columns),
        "walk, chain only": best(lambda: walk(conn.execute(CHAIN_SELECT + where), start, first)),
        "walk, chain + index columns (verify's)": best(lambda: walk(conn.execute(INDEXED_CHAIN_SELECT + where), start, first, indexed=True)),
    }
    conn.close()
    size = sum(len(r[1]) for r in rows) / len(rows)
    print(f"  where a record's CPU goes ({len(rows):,} records of {size:,.0f} bytes, one process, best of 3, load "
          f"{os.getloadavg()[0]:.1f}): " + "; ".join(f"{k} {v:.2f} us" for k, v in parts.items()))


def export_bench(path: Path, base: float, n: int) -> None:
    """`policyc audit export` of the first `n` records of `path` in each format: records/s,
    and the file read back (count and hashes equal to the log's)."""
    import sqlite3

    from policyc.audit import export as ex
    from policyc.audit.segments import files

    want: list[bytes] = []
    for f in files(path):
        with sqlite3.connect(f) as db:
            want += [bytes(h) for (h,) in db.execute("SELECT hash FROM entries WHERE time < ? ORDER BY seq", (base + n * 1e-3,))]
            if len(want) >= n:
                break
    for fmt in ex.FORMATS:
        out = path.parent / f"export.{fmt}"
        c0, t0 = time.process_time(), time.perf_counter()
        stats = ex.export(path, fmt, out, end=base + n * 1e-3)
        took, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows = [bytes.fromhex(r["hash"]) for r in ex.read(out)]
        assert stats.rows == len(rows) == len(want) and rows == want, (fmt, stats.rows, len(rows), len(want))
        print(f"export {fmt}: {stats.rows:,} records in {took:.2f} s ({stats.rows / took:,.0f} records/s, "
              f"{out.stat().st_size / 1e6:,.0f} MB; CPU {cpu:.2f} s, {stats.rows / cpu:,.0f} records per CPU second); "
              "read back: count and hashes equal")


def cost_per_decision(instances: int, n: int = 2000) -> None:
    """Single-thread cost of each step on the decision thread, to show where the time goes."""
    server = make_server(instances)
    bundle = server.engine.state.bundle
    ds = [server.engine.decide(INPUTS[i % 4]) for i in range(n)]
    t0 = time.perf_counter()
    ds = [server.engine.decide(INPUTS[i % 4]) for i in range(n)]
    t1 = time.perf_counter()
    recs = [decision_record(d, REQUESTS[i % 4], bundle) for i, d in enumerate(ds)]
    t2 = time.perf_counter()
    for r in recs:
        r.model_dump_json(exclude_none=True)
    t3 = time.perf_counter()
    drafts = [draft_of(d, REQUESTS[i % 4], bundle) for i, d in enumerate(ds)]
    t4 = time.perf_counter()
    for dr in drafts:
        wire_draft(dr)
    t5 = time.perf_counter()
    structs = [wire_of(d, REQUESTS[i % 4], bundle) for i, d in enumerate(ds)]
    t6 = time.perf_counter()
    wire_drafts(structs)
    t7 = time.perf_counter()
    server.refresher.stop()
    us = lambda a, b: (b - a) / n * 1e6  # noqa: E731
    print(f"per decision, one thread: decide {us(t0, t1):.0f} us; DecisionRecord build {us(t1, t2):.0f} us + JSON {us(t2, t3):.0f} us (former bridge); "
          f"draft_of {us(t3, t4):.1f} us + wire_draft {us(t4, t5):.1f} us (plain-values drafts); "
          f"wire_of {us(t5, t6):.1f} us + wire_drafts {us(t6, t7):.1f} us (the server bridge now; the pipe write is on the sender thread)")


GATEWAY_RATES = (180, 500)  # calls/s of the gateway benchmark's audited rig at 1 and 16 callers (measured)


def _gateway_call(i: int, decision_id: str) -> bytes:
    """A gateway call's accounting body, its figures as the gateway benchmark's calls have them."""
    from policyc.gateway.access_log import Attempt, Call, accounting_body

    host = f"127.0.0.1:{40650 + i % 3}"
    call = Call(decision_id=decision_id, start=time.time(), received=147, sent=4469, duration=0.055, first_byte=0.0552,
                attempts=1, grpc_status="0", tls=False, upstream_first_byte=0.0551, upstream_connect=0.0012,
                upstream_connection=str(6 + i % 3), variant="full", upstream_host=host,
                instance=f"fraud-scorer-lite@host-0002/gpu{i % 3}#gw", upstream_sent=206, upstream_received=4596,
                upstream_duration=0.048, upstream_rx_after_tx=0.0479, status=200, compute_seconds=0.000424)
    answer = Attempt(host=host, instance=call.instance, sent=206, received=4596, duration=0.048, first_byte=0.0479,
                     status=200, grpc_status="0", compute_seconds=0.000424, flags="")
    return accounting_body(call, [answer])


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def writer_per_call(tmp: Path, instances: int, rounds: int, seconds: float, rates: tuple[int, ...] = GATEWAY_RATES) -> None:
    """The audit writer process alone, as the gateway drives it: each call one decision (as
    the bridge hands it: `wire_of`'s struct) and one accounting body, handed over together
    every FLUSH_AFTER (50 ms) at a paced rate (the bridge's group commit), a fresh log per
    round. Prints the writer's CPU per call (two records) at each rate, records per commit,
    and this process's CPU per call (the hand-over and the log's threads); with two rates, the split of the
    writer's cost into a fixed cost per commit and a cost per call (CPU per call =
    per call + per commit / calls per commit)."""
    from policyc.server.audit_bridge import FLUSH_AFTER

    server = make_server(instances)
    bundle = server.engine.state.bundle
    decided = [server.engine.decide(INPUTS[i % len(INPUTS)]) for i in range(400)]
    server.refresher.stop()
    drafts = [wire_of(d, REQUESTS[i % len(REQUESTS)], bundle) for i, d in enumerate(decided)]
    bodies = [_gateway_call(i, d.decision_id) for i, d in enumerate(decided)]
    print(f"writer per gateway call: a decision ({statistics.mean(len(wire_draft(d)) for d in drafts):.0f} B as a draft) and an "
          f"accounting record ({statistics.mean(map(len, bodies)):.0f} B) a call, handed over every {FLUSH_AFTER * 1e3:.0f} ms; "
          f"{rounds} rounds of {seconds:g} s per rate, alternating")
    c0 = time.process_time()
    time.sleep(1.0)
    idle = time.process_time() - c0  # this process's CPU per second with no log (the decision server's threads), subtracted
    found: dict[int, list[tuple[float, float, float]]] = {r: [] for r in rates}
    for k in range(rounds):
        for rate in (rates if k % 2 == 0 else rates[::-1]):
            per = max(1, round(rate * FLUSH_AFTER))
            with AuditLog.open(tmp / f"writer-{k}-{rate}.db", warm=True) as log:
                nxt = 0

                def hand_over() -> None:
                    nonlocal nxt
                    idx = [(nxt + j) % len(drafts) for j in range(per)]
                    nxt += per
                    log.submit_decision_drafts([drafts[j] for j in idx], [bodies[j] for j in idx])

                for _ in range(20):  # a log with some pages before the measured phase
                    hand_over()
                log.submit_body(bodies[0]).wait()
                w0, s0, n0, p0 = _proc_cpu(log._proc.pid), log.last_seq, log.commits, time.process_time()
                t0 = due = time.perf_counter()
                calls = 0
                while time.perf_counter() - t0 < seconds:
                    hand_over()
                    calls += per
                    due += FLUSH_AFTER
                    time.sleep(max(0.0, due - time.perf_counter()))
                log.submit_body(bodies[0]).wait()
                p1, wall = time.process_time(), time.perf_counter() - t0
                w1, s1, n1 = _proc_cpu(log._proc.pid), log.last_seq, log.commits
            found[rate].append(((w1 - w0) / calls, (s1 - s0) / max(1, n1 - n0), (p1 - p0 - idle * wall) / calls))
    for rate, xs in found.items():
        print(f"  {rate:4d} calls/s: writer {statistics.median(x[0] for x in xs) * 1e6:5.1f} us CPU per call "
              f"({', '.join(f'{x[0] * 1e6:.0f}' for x in xs)}), {statistics.median(x[1] for x in xs):.0f} records per commit, "
              f"this process {statistics.median(x[2] for x in xs) * 1e6:.1f} us per call (encoding, hand-over, the log's "
              f"sender and acknowledgement threads; net of its idle {idle * 1e3:.0f} ms CPU/s)")
    if len(rates) == 2:
        (ra, xa), (rb, xb) = found.items()
        ca, cb = (statistics.median(x[0] for x in xs) for xs in (xa, xb))
        ka, kb = (statistics.median(x[1] for x in xs) / 2 for xs in (xa, xb))  # calls per commit
        fixed = (ca - cb) / (1 / ka - 1 / kb)
        print(f"  writer cost split: {fixed * 1e3:.2f} ms CPU per commit + {(ca - fixed / ka) * 1e6:.0f} us per call "
              f"(at {ka:.0f} and {kb:.0f} calls a commit)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 s phases and 100,000 records for verify")
    ap.add_argument("--instances", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=("cost", "throughput", "writer", "durability", "verify", "export"), help="run one part")
    ap.add_argument("--segments", type=int, default=4, help="segments the verify log is rotated into (default 4)")
    ap.add_argument("--export-records", type=int, help="records exported in each format (default: 100,000; 20,000 with --quick)")
    ap.add_argument("--client-threads", type=int, default=8, help="gRPC client threads of the durability part")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    seconds = 1.0 if args.quick else 2.0
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        tmp = Path(d)
        if args.only in (None, "cost"):
            cost_per_decision(args.instances)
        if args.only in (None, "throughput"):
            throughput(tmp, args.instances, args.threads, rounds=args.rounds, seconds=seconds)
        if args.only in (None, "writer"):
            writer_per_call(tmp, min(args.instances, 2_000), rounds=args.rounds, seconds=seconds)
        if args.only in (None, "durability"):
            durability(tmp, min(args.instances, 2_000), args.client_threads, rounds=args.rounds, seconds=seconds)
        if args.only in (None, "verify", "export"):
            n = 100_000 if args.quick else 1_000_000
            path, base = verify_bench(tmp, n if args.only != "export" else max(args.export_records or 100_000, 20_000), args.segments)
            if args.only != "export":
                verify_parts(path, min(100_000, n // max(args.segments, 1)))
            if args.only in (None, "export"):
                export_bench(path, base, args.export_records or (20_000 if args.quick else 100_000))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
